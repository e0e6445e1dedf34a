"""A stand-in for `vllm serve` (run as a child process: python fake_vllm_server.py PORT) with the HTTP
surface draftsmith.eval.speedup reads: /health, /v1/models, /v1/completions (return_token_ids) and
/metrics with the spec-decode counters. Its rule, for tests to compute by hand: a completion of an
n-token prompt returns the prompt's first max_tokens ids and counts 2 drafts, n // 2 accepted tokens
(4 draft tokens), and one accepted token at position 0 when n >= 2. With ``--hang MARK`` a completion
instead writes the server's pid to MARK and never returns (a pass in flight when a SIGTERM comes)."""

import json
import os
import sys
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

STATE = {"drafts": 0, "draft_tokens": 0, "accepted": 0, "pos0": 0}
HANG = sys.argv[sys.argv.index("--hang") + 1] if "--hang" in sys.argv else None


class Handler(BaseHTTPRequestHandler):
    def log_message(self, *a):
        pass

    def reply(self, obj, ctype="application/json"):
        data = obj.encode() if isinstance(obj, str) else json.dumps(obj).encode()
        self.send_response(200)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        if self.path == "/health":
            self.reply("")
        elif self.path == "/v1/models":
            self.reply({"data": [{"id": "fake"}]})
        elif self.path == "/metrics":
            s = STATE
            self.reply("\n".join([
                f'vllm:spec_decode_num_drafts_total{{engine="0"}} {s["drafts"]}.0',
                f'vllm:spec_decode_num_draft_tokens_total{{engine="0"}} {s["draft_tokens"]}.0',
                f'vllm:spec_decode_num_accepted_tokens_total{{engine="0"}} {s["accepted"]}.0',
                f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{engine="0",position="0"}} {s["pos0"]}.0',
            ]) + "\n", "text/plain")
        else:
            self.send_error(404)

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if HANG:
            with open(HANG + ".tmp", "w") as fh:
                fh.write(str(os.getpid()))
            os.replace(HANG + ".tmp", HANG)  # whole, so the test never reads half a pid
            time.sleep(600)
        ids = body["prompt"]
        n = len(ids)
        STATE["drafts"] += 2
        STATE["draft_tokens"] += 4
        STATE["accepted"] += n // 2
        STATE["pos0"] += 1 if n >= 2 else 0
        self.reply({"choices": [{"token_ids": ids[: body["max_tokens"]]}]})


if __name__ == "__main__":
    ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), Handler).serve_forever()
