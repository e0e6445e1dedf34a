"""An in-process stand-in for a vLLM server with a draft, for `draftsmith check`'s fast tests: the HTTP
surface check reads (/v1/models, /metrics spec-decode counters per position, /server_info,
/v1/chat/completions with return_token_ids), answering with the EXACT offline decoder
(:class:`draftsmith.eval.check.OfflineDecoder`) so that a faithful fake serves what offline decodes, and
a fault (other layer ids, another chat template) changes the served acceptance the way a real
misconfigured server does. The real-vLLM version of the same checks is tests/integration/test_check_vllm.py."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Optional


class FakeCheckServer:
    """``with FakeCheckServer(decoder, k, aux_ids=..., template=..., draft_dir=...) as url:``"""

    def __init__(self, decoder, k: int, *, aux_ids=None, template: Optional[str] = None,
                 draft_dir: Optional[str] = None, dtype: str = "float32", server_info: bool = True,
                 max_model_len: int = 512):
        self.decoder, self.k, self.aux_ids, self.template = decoder, k, aux_ids, template
        self.draft_dir, self.dtype, self.server_info, self.max_model_len = draft_dir, dtype, server_info, max_model_len
        self.state = {"drafts": 0, "draft_tokens": 0, "accepted": 0, "per_position": [0] * k}
        self.lock = threading.Lock()

    def metrics(self) -> str:
        s = self.state
        lines = [f'vllm:spec_decode_num_drafts_total{{engine="0"}} {s["drafts"]}.0',
                 f'vllm:spec_decode_num_draft_tokens_total{{engine="0"}} {s["draft_tokens"]}.0',
                 f'vllm:spec_decode_num_accepted_tokens_total{{engine="0"}} {s["accepted"]}.0']
        lines += [f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{engine="0",position="{i}"}} {c}.0'
                  for i, c in enumerate(s["per_position"])]
        return "\n".join(lines) + "\n"

    def complete(self, body: dict) -> dict:
        from draftsmith.eval.prompts import render_prompt

        tok = self.decoder.tokenizer
        saved = tok.chat_template
        if self.template is not None:
            tok.chat_template = self.template
        try:
            ids = render_prompt(tok, body["messages"], body.get("chat_template_kwargs"))
        finally:
            tok.chat_template = saved
        eos = [] if body.get("ignore_eos") else self.decoder.eos_ids()
        with self.lock:
            r = self.decoder.decode([ids], k=self.k, max_new_tokens=body["max_tokens"], eos_ids=eos,
                                    aux_ids=self.aux_ids)[0]
            s = self.state
            s["drafts"] += r["drafts"]
            s["draft_tokens"] += r["drafts"] * self.k
            s["accepted"] += r["accepted"]
            s["per_position"] = [a + b for a, b in zip(s["per_position"], r["per_position"])]
        return {"prompt_token_ids": ids, "choices": [{"message": {"content": ""}, "token_ids": r["token_ids"]}]}

    def __enter__(self) -> str:
        fake = self

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
                if self.path == "/v1/models":
                    self.reply({"data": [{"id": "fake", "max_model_len": fake.max_model_len}]})
                elif self.path == "/metrics":
                    self.reply(fake.metrics(), "text/plain")
                elif self.path.startswith("/server_info") and fake.server_info:
                    self.reply({"vllm_config": {
                        "model_config": {"dtype": f"torch.{fake.dtype}", "max_model_len": fake.max_model_len},
                        "speculative_config": {"method": "eagle3", "model": fake.draft_dir,
                                               "num_speculative_tokens": fake.k}}})
                else:
                    self.send_error(404)

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                self.reply(fake.complete(body))

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()
        return f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def __exit__(self, *exc) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
