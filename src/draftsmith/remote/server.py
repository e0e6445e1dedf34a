"""`draftsmith serve-target`: run the target in its own process and serve features over HTTP.

Control plane: HTTP/1.1 keep-alive, JSON for small answers, :mod:`draftsmith.remote.wire` frames
for tensors. Endpoints:

    GET  /health      {"ok", "features_served", "vocab_maps", "disconnects"}
    GET  /info        TargetInfo fields + aux_layer_ids, supervision_kinds, engine, cuda, frame limits
    GET  /embeddings  frame: embeddings (V, H) [+ lm_head (V, H) when untied, final_norm (H,)]
    POST /vocab-map   frame: draft_ids (Vd,) int64, or meta {"full_vocab": true} -> {"vocab_id"}
    POST /features    frame: input_ids, attention_mask, loss_mask (B, S) int64;
                      meta {"mode": "supervision", "kind", "vocab_id"?, "layer_ids"} -> supervision of
                      that kind (the registry of draftsmith.supervision; its dataclass fields are the tensor
                      names, e.g. eagle3: aux_hidden, input_ids, loss_mask, target_probs, position_mask),
                      computed here so no full-vocab (B, S, V) tensor crosses the wire (dflash_kd sends
                      last_hidden (B, S, H), the state at id L, in the engine's dtype); kinds that project onto the
                      draft vocab need the "vocab_id" of a pushed map; or meta {"mode": "features", "logits"}.
    POST /data-plane  JSON {"session", "plane": "nccl"|"gloo", "previous"?} -> {"store_port"}: opens a
                      tensor channel (remote/nccl.py); /features with meta.session then answers with
                      a header-only frame (meta.transfer) and sends the tensors over that channel
    POST /disconnect  JSON {"session"?} (or empty) -> {"ok": true}; closes the session's channel

Rules: ``/features`` runs under one lock (the engine is not re-entrant and a second forward would only
compete for the same cores); a ``vocab_id`` this process has not seen is a 409 (push ``/vocab-map``
first: a restarted server forgets maps); Content-Length is checked before the body is read
(missing -> 411, over the limit -> 413 and the connection is closed unread); every malformed frame
is a 400 and the server stays up. Loopback bind by default; a non-loopback bind needs a bearer token
(or an explicit ``--insecure``); with a token, requests without ``Authorization: Bearer`` get 401.
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import hmac
import ipaddress
import json
import os
import socket
import sys
import threading
from collections import OrderedDict
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Callable, Optional

import torch

from draftsmith.remote import wire
from draftsmith.remote.nccl import (JOINED_KEY, SESSION_RE, Channel, cuda_uuid, local_planes, open_store,
                                    transfer_entries, transfer_plan)
from draftsmith.targets import Batch, supervision_for
from draftsmith.targets.contract import (TargetError, ascending_layer_ids, default_aux_layer_ids,
                                        supervision_kind, supervision_kinds, supervision_tensors,
                                        validate_layer_ids)


class ServeTargetError(TargetError):
    """``draftsmith serve-target`` was started with settings that are unsafe or inconsistent: a
    non-loopback ``--host`` without a token, engine flags that do not fit ``--engine``. Fix: change the
    flag the message names (or pass ``--auth-token-file`` / ``--insecure`` for a non-loopback bind)."""


MAX_VOCAB_MAPS = 8  # distinct draft vocabularies kept per server (one per concurrent run, in practice)
MAX_CHANNELS = 8  # open data-plane sessions per server (one per client process; the oldest is closed)
MAX_PENDING = 4  # handshakes waiting for their client at once (each holds a port and a thread); more -> 429


def is_loopback(host: str) -> bool:
    """True when ``host`` resolves to a loopback address (127.0.0.0/8, ::1, localhost)."""
    try:
        return all(ipaddress.ip_address(info[4][0]).is_loopback
                   for info in socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP))
    except (OSError, ValueError):
        return False


def engine_device(spec: str, engine: str) -> Optional[str]:
    """The device string for ``--device`` (None for engines that place the target themselves): hf runs
    the target there, the cache engine returns its features there. Checked as ``train.device`` is
    (``auto``: this process's local GPU when there is one, else the CPU)."""
    if engine not in ("hf", "cache"):
        return None
    from draftsmith.distributed import DistError, local_device

    try:
        return str(local_device(spec, "--device"))
    except DistError as e:  # python -m draftsmith.remote.server reports TargetErrors (exit 2)
        raise ServeTargetError(str(e)) from None


def check_bind(host: str, token: Optional[str], insecure: bool) -> None:
    """Refuse a non-loopback bind without a token unless ``insecure`` says it is deliberate."""
    if not is_loopback(host) and not token and not insecure:
        raise ServeTargetError(
            f"serve-target --host {host}: binding beyond loopback without --auth-token-file exposes the target "
            f"to the network; pass --auth-token-file F (recommended) or --insecure")


class TargetService:
    """The engine plus the per-server state the endpoints share (thread-safe)."""

    def __init__(self, engine, engine_name: str, aux_layer_ids=None, limits: wire.Limits = wire.Limits(),
                 plane_timeout_s: float = 120.0):
        self.engine, self.engine_name, self.limits = engine, engine_name, limits
        self.plane_timeout_s = plane_timeout_s
        self.planes = local_planes()
        self.channels: "OrderedDict[str, Channel]" = OrderedDict()  # data-plane sessions, oldest first
        self.channel_lock = threading.Lock()
        self.pending = threading.BoundedSemaphore(MAX_PENDING)
        # NCCL sends from the engine's GPU (or this process's current one), captured here: channels
        # are built on handler threads, where the current device is always 0.
        self.cuda_device, self.cuda_uuid = None, None
        if "nccl" in self.planes:
            dev = getattr(engine, "device", None)
            self.cuda_device = dev if isinstance(dev, torch.device) and dev.type == "cuda" else \
                torch.device("cuda", torch.cuda.current_device())
            self.cuda_uuid = cuda_uuid(self.cuda_device)
        self.info = engine.info()
        L = self.info.num_layers
        # the default ids a request without layer_ids gets: ascending, as trainers ask and engines serve
        self.aux_ids, self.aux_note = ascending_layer_ids(
            validate_layer_ids(aux_layer_ids or default_aux_layer_ids(L), L, key="--aux-layer-ids"), key="--aux-layer-ids")
        self.lock = threading.Lock()  # serialises /features (and vocab-map bookkeeping)
        self.vocab_maps: "OrderedDict[str, Optional[torch.Tensor]]" = OrderedDict()
        self.stats = {"features_served": 0, "disconnects": 0, "plane_transfers": 0, "plane_failures": 0}
        self.stats_lock = threading.Lock()

    def info_dict(self) -> dict:
        return {**self.info.to_dict(), "aux_layer_ids": self.aux_ids, "supervision_kinds": supervision_kinds(),
                "engine": self.engine_name,
                "cuda": torch.cuda.is_available(), "data_planes": self.planes, "cuda_uuid": self.cuda_uuid,
                "wire_version": wire.VERSION,
                "max_body": self.limits.max_body, "max_elements": self.limits.max_elements}

    def embeddings_frame(self) -> bytes:
        emb = self.engine.embeddings()
        tensors = {"embeddings": emb}
        try:
            head, norm = self.engine.lm_head_weight(), self.engine.final_norm_weight()
        except TargetError:  # an engine without a head: clients' lm_head_weight() then says so
            head = norm = None
        if head is not None:
            if head.data_ptr() != emb.data_ptr():  # tied targets send the matrix once
                tensors["lm_head"] = head
            tensors["final_norm"] = norm
        return wire.encode(tensors, {"tied": bool(self.info.tied), "has_head": "final_norm" in tensors})

    def push_vocab_map(self, frame: wire.Frame) -> dict:
        V = self.info.vocab_size
        if frame.meta.get("full_vocab") is True and not frame.tensors:
            ids, key = None, "full"
        else:
            ids = frame.tensors.get("draft_ids")
            if ids is None or set(frame.tensors) != {"draft_ids"} or ids.dtype != torch.int64 or ids.dim() != 1:
                raise wire.FrameError("vocab-map: expected one tensor 'draft_ids' (Vd,) int64 or meta full_vocab")
            if ids.numel() < 1 or int(ids.min()) < 0 or int(ids.max()) >= V or ids.unique().numel() != ids.numel():
                raise wire.FrameError(f"vocab-map: draft_ids must be distinct ids in 0..{V - 1}", 422)
            ids = ids.clone()  # the frame's buffer belongs to the request
            key = hashlib.sha256(ids.numpy().tobytes()).hexdigest()[:16]
        with self.lock:
            self.vocab_maps[key] = ids
            self.vocab_maps.move_to_end(key)
            while len(self.vocab_maps) > MAX_VOCAB_MAPS:
                self.vocab_maps.popitem(last=False)
        return {"vocab_id": key, "draft_vocab_size": V if ids is None else int(ids.numel())}

    def features_answer(self, frame: wire.Frame) -> tuple[bytes, Optional[Callable[[], None]]]:
        """``(body, after)``: the response body and, on a data-plane session, the send to run once
        the response is flushed (the body then carries only the header, ``meta.transfer``)."""
        meta, t = frame.meta, frame.tensors
        if set(t) != {"input_ids", "attention_mask", "loss_mask"}:
            raise wire.FrameError("features: expected tensors input_ids, attention_mask, loss_mask")
        ids = t["input_ids"]
        if ids.dim() != 2 or any(x.shape != ids.shape or x.dtype != torch.int64 for x in t.values()):
            raise wire.FrameError("features: input_ids, attention_mask, loss_mask must be (B, S) int64 of one shape", 422)
        if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= self.info.vocab_size):
            raise wire.FrameError(f"features: input_ids must lie in 0..{self.info.vocab_size - 1}", 422)
        if ids.shape[1] > self.info.max_position_embeddings:
            raise wire.FrameError(f"features: sequence length {ids.shape[1]} exceeds the target's "
                                  f"max_position_embeddings {self.info.max_position_embeddings}", 422)
        if any(bool(((m != 0) & (m != 1)).any()) for m in (t["attention_mask"], t["loss_mask"])):
            raise wire.FrameError("features: attention_mask and loss_mask must hold only 0/1", 422)
        layer_ids = meta.get("layer_ids", self.aux_ids)
        if not isinstance(layer_ids, list):
            raise wire.FrameError("features: meta.layer_ids must be a list of ints", 422)
        mode = meta.get("mode")
        channel, session = None, meta.get("session")
        if session is not None:  # checked before the forward: a restarted server knows no sessions
            with self.channel_lock:
                channel = self.channels.get(session) if isinstance(session, str) else None
            if channel is None:
                raise wire.FrameError(f"features: data-plane session {str(session)[:32]!r} is unknown here; "
                                      f"POST /data-plane again", 409, redo="data-plane")
        batch = Batch(ids, t["attention_mask"], t["loss_mask"])
        if mode == "supervision":
            name = meta.get("kind")
            kind = supervision_kind(name) if isinstance(name, str) and name in supervision_kinds() else None
            if kind is None:
                raise wire.FrameError(f"features: meta.kind {str(meta.get('kind'))[:32]!r} is not a supervision kind "
                                      f"this server knows ({supervision_kinds()})", 422)
            vid = meta.get("vocab_id")
            with self.lock:
                if kind.vocab and (not isinstance(vid, str) or vid not in self.vocab_maps):
                    raise wire.FrameError(f"features: vocab_id {str(vid)[:32]!r} is unknown here; POST /vocab-map first", 409,
                                          redo="vocab-map")
                draft_ids = self.vocab_maps[vid] if kind.vocab else None
                sup = supervision_for(self.engine, kind.name, batch, layer_ids, draft_ids)
                self.stats["features_served"] += 1
            return self._answer(supervision_tensors(sup), session, channel)
        if mode == "features":
            with self.lock:
                feats = self.engine.features(batch, layer_ids, logits=bool(meta.get("logits")))
                self.stats["features_served"] += 1
            out = {"aux_hidden": feats.aux_hidden}
            if feats.logits is not None:
                out["logits"] = feats.logits
            return self._answer(out, session, channel)
        raise wire.FrameError(f"features: meta.mode {str(mode)[:32]!r} must be 'supervision' or 'features'", 422)

    def _answer(self, out: dict, session: Optional[str], channel: Optional[Channel]):
        if channel is None:
            return wire.encode(out), None
        entries = transfer_entries(out)
        plan = transfer_plan(entries)

        def after() -> None:  # runs after the header-only response is flushed
            try:
                with channel.lock:
                    channel.send(out, plan)
                with self.stats_lock:
                    self.stats["plane_transfers"] += 1
            except Exception as e:  # the client died or timed out: its session is over
                self.close_channel(session)  # before the count, so a counted failure is a closed session
                with self.stats_lock:
                    self.stats["plane_failures"] += 1
                print(f"serve-target: data-plane session {session[:8]} closed: {e.__class__.__name__}: "
                      f"{str(e)[:200]}", file=sys.stderr, flush=True)

        return wire.encode({}, {"plane": channel.backend, "transfer": entries}), after

    # ------------------------------------------------------------------ data-plane sessions
    def open_data_plane(self, req: dict, local_host: str) -> dict:
        """Open a store for session ``req['session']`` and build rank 0 of its channel in the background.

        ``local_host`` is this side's address of the HTTP connection that asked: the store and the
        gloo pair listen there only, so a loopback server stays on loopback.
        """
        sid, plane = req.get("session"), req.get("plane")
        if not isinstance(sid, str) or not SESSION_RE.match(sid):
            raise wire.FrameError("data-plane: 'session' must be 32 lowercase hex characters (uuid4().hex)", 422)
        if plane not in self.planes or plane == "wire":
            raise wire.FrameError(f"data-plane: plane {str(plane)[:16]!r} is not offered here "
                                  f"(this server offers {[p for p in self.planes if p != 'wire']})", 422)
        if isinstance(req.get("previous"), str):
            self.close_channel(req["previous"], wait=False)  # the client's earlier session with us is over
        if not self.pending.acquire(blocking=False):  # 429, not 5xx: the client keeps using this server
            raise wire.FrameError(f"data-plane: {MAX_PENDING} handshakes are already waiting for their clients; "
                                  f"use the wire or try again later", 429)
        try:
            store, port = open_store(local_host, self.plane_timeout_s)
        except BaseException:
            self.pending.release()
            raise

        def build() -> None:
            try:
                # The client marks the store once it joined: a client that never comes ends here, after the
                # timeout, before any group exists (NCCL's lazy setup in the first send has no timeout).
                store.wait([JOINED_KEY], datetime.timedelta(seconds=self.plane_timeout_s))
                channel = Channel(plane, store, 0, self.plane_timeout_s, local_host, self.cuda_device)  # gloo: waits
                with self.channel_lock:  # registered before the probe: the client may ask right after it
                    self.channels[sid] = channel
                    ready = [k for k, c in self.channels.items() if c.ready]  # oldest first
                    victims = [self.channels.pop(k) for k in ready[: max(0, len(ready) + 1 - MAX_CHANNELS)]]
                for v in victims:  # closed off the lock: closing can wait on a transfer in flight
                    threading.Thread(target=v.close, daemon=True).start()
                try:
                    with channel.lock:
                        channel.send_probe()
                except Exception:
                    self.close_channel(sid)
                    raise
            except Exception as e:
                print(f"serve-target: data-plane session {sid[:8]} not opened: {e.__class__.__name__}: "
                      f"{str(e)[:200]}", file=sys.stderr, flush=True)
            finally:
                self.pending.release()

        try:
            threading.Thread(target=build, name=f"data-plane-{sid[:8]}", daemon=True).start()
        except BaseException:
            self.pending.release()
            raise
        return {"session": sid, "plane": plane, "store_port": port}

    def close_channel(self, sid, wait: bool = True) -> None:
        """End session ``sid`` (unknown ids are ignored); ``wait=False`` closes on a thread, for HTTP handlers."""
        with self.channel_lock:
            channel = self.channels.pop(sid, None) if isinstance(sid, str) else None
        if channel is not None:
            if wait:
                channel.close()  # waits for a send in flight
            else:
                threading.Thread(target=channel.close, daemon=True).start()


def make_handler(service: TargetService, token: Optional[str]):
    """A request handler class bound to ``service`` (http.server wants a class, not an instance)."""

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive: every response carries Content-Length
        server_version = "draftsmith-serve-target"

        def log_message(self, fmt, *args):  # quiet: a trainer sends thousands of requests
            pass

        def setup(self):
            super().setup()
            # Headers and body go out in separate writes: without TCP_NODELAY, Nagle + delayed ACK
            # add ~40 ms to every keep-alive round trip.
            self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

        def _send(self, status: int, body: bytes, ctype: str = "application/json", close: bool = False) -> None:
            self.send_response(status)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            if close:
                self.send_header("Connection", "close")
                self.close_connection = True
            self.end_headers()
            self.wfile.write(body)

        def _json(self, status: int, obj: dict, close: bool = False) -> None:
            self._send(status, json.dumps(obj).encode(), close=close)

        def _authorised(self) -> bool:
            if not token:
                return True
            got = self.headers.get("Authorization", "")
            if got.startswith("Bearer ") and hmac.compare_digest(got[7:].encode(), token.encode()):
                return True
            self._json(401, {"error": "missing or wrong Authorization: Bearer token"}, close=True)
            return False

        def do_GET(self):
            if not self._authorised():
                return
            path = self.path.split("?", 1)[0]
            if path == "/health":
                self._json(200, {"ok": True, **service.stats, "vocab_maps": len(service.vocab_maps)})
            elif path == "/info":
                self._json(200, service.info_dict())
            elif path == "/embeddings":
                self._send(200, service.embeddings_frame(), "application/octet-stream")
            else:
                self._json(404, {"error": f"no endpoint GET {path[:64]}"})

        def do_POST(self):
            if not self._authorised():
                return
            path = self.path.split("?", 1)[0]
            if path not in ("/vocab-map", "/features", "/disconnect", "/data-plane"):
                return self._json(404, {"error": f"no endpoint POST {path[:64]}"}, close=True)
            length = self.headers.get("Content-Length")
            if length is None or not length.strip().isdigit():
                return self._json(411, {"error": "Content-Length (a decimal byte count) is required"}, close=True)
            n = int(length)
            if n > service.limits.max_body:  # refuse before reading a byte of it
                return self._json(413, {"error": f"body of {n} bytes exceeds the limit {service.limits.max_body}"},
                                  close=True)
            body = bytearray(n)
            view, got = memoryview(body), 0
            while got < n:
                k = self.rfile.readinto(view[got:])
                if not k:
                    return self._json(400, {"error": f"body ended after {got} of {n} bytes"}, close=True)
                got += k
            try:
                if path in ("/disconnect", "/data-plane"):
                    req = _json_body(body)
                    if path == "/data-plane":
                        return self._json(200, service.open_data_plane(req, self.connection.getsockname()[0]))
                    with service.stats_lock:  # not the features lock: a long forward must not delay a goodbye
                        service.stats["disconnects"] += 1
                    service.close_channel(req.get("session"), wait=False)
                    return self._json(200, {"ok": True})
                frame = wire.decode(body, service.limits)
                if path == "/vocab-map":
                    return self._json(200, service.push_vocab_map(frame))
                answer, after = service.features_answer(frame)
                self._send(200, answer, "application/octet-stream")
                if after is not None:
                    self.wfile.flush()  # the client reads the header, then waits on the channel
                    after()
                return
            except wire.FrameError as e:  # "redo": what a client should send again (409s)
                return self._json(e.status, {"error": str(e), **({"redo": e.redo} if e.redo else {})})
            except TargetError as e:  # e.g. a layer id out of range: the request, not the server, is wrong
                return self._json(422, {"error": str(e)})
            except Exception as e:  # an engine failure: answer instead of dropping the connection
                return self._json(500, {"error": f"{e.__class__.__name__}: {str(e)[:200]}"})

    return Handler


def _json_body(body: bytearray) -> dict:
    """A small JSON object body (empty -> {}); anything else is a 400."""
    if not body:
        return {}
    try:
        req = json.loads(bytes(body).decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        raise wire.FrameError("body: expected a JSON object") from None
    if not isinstance(req, dict):
        raise wire.FrameError("body: expected a JSON object")
    return req


class _Server(ThreadingHTTPServer):
    daemon_threads = True  # a hung client connection never blocks shutdown

    def handle_error(self, request, client_address):
        # A client that timed out or died mid-answer is the client's problem (it retries elsewhere).
        if not isinstance(sys.exc_info()[1], (BrokenPipeError, ConnectionResetError, TimeoutError)):
            super().handle_error(request, client_address)


def build_server(service: TargetService, host: str, port: int, token: Optional[str] = None,
                 insecure: bool = False) -> ThreadingHTTPServer:
    """Bind (after the bind rule) and return the server; call ``serve_forever()`` on it."""
    check_bind(host, token, insecure)
    return _Server((host, port), make_handler(service, token))


def run(args: argparse.Namespace) -> int:
    """Handler of `draftsmith serve-target`; prints `READY host:port` once it accepts requests."""
    token = None
    if args.auth_token_file:
        path = Path(args.auth_token_file)
        if not path.is_file():
            raise ServeTargetError(f"--auth-token-file: '{path}' does not exist; write the token into it")
        token = path.read_text().strip()
        if not token:
            raise ServeTargetError(f"--auth-token-file: '{path}' is empty; write a non-empty token into it")
    check_bind(args.host, token, args.insecure)  # before loading a (possibly huge) target
    if args.num_threads:
        torch.set_num_threads(args.num_threads)
    from draftsmith.remote.cli import engine_options
    from draftsmith.targets import open_engine

    options = engine_options(args)  # flag errors before loading a (possibly huge) target
    engine = open_engine(args.engine, args.target, dtype=args.dtype, device=engine_device(args.device, args.engine),
                         **options)
    limits = wire.Limits(max_body=args.max_body_mb << 20)
    if is_loopback(args.host):  # NCCL picks its own interfaces and skips lo: keep a loopback server on lo
        os.environ.setdefault("NCCL_SOCKET_IFNAME", "lo")
    service = TargetService(engine, args.engine, args.aux_layer_ids, limits, args.data_plane_timeout_s)
    server = build_server(service, args.host, args.port, token, args.insecure)
    host, port = server.server_address[:2]
    if service.aux_note:
        print(f"draftsmith: {service.aux_note}", file=sys.stderr, flush=True)
    print(f"READY {host}:{port}", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
        engine.close()
    return 0


def main(argv=None) -> int:
    from draftsmith.remote.cli import add_arguments

    p = argparse.ArgumentParser(prog="python -m draftsmith.remote.server", description=__doc__.splitlines()[0])
    add_arguments(p)
    try:
        return run(p.parse_args(argv))
    except TargetError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
