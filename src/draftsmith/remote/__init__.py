"""Remote target: `draftsmith serve-target` runs the target; the `remote` engine trains against it.

wire.py (binary tensor frames), server.py (HTTP server), client.py (RemoteEngine), nccl.py (GPU data
plane, used only when both sides have CUDA), cli.py (`serve-target` subcommand). See docs/reference/wire.md.
"""
