"""bench-server against fake OpenAI-compatible servers on 127.0.0.1: counters, retries, clear errors."""

import json
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from deadline import HANG_S
from draftsmith.eval import EvalError
from draftsmith.eval.online import HttpClient, bench_server, parse_prometheus, vllm_spec_counters
from draftsmith.eval.prompts import EvalPrompt
from draftsmith.eval.report import format_table

FAST = HttpClient(retries=3, backoff_s=0.01, timeout_s=HANG_S)  # quick retries; the timeout only guards a hang


class Fake:
    """State of one fake server. mode: vllm | plain | sglang. `failures`: actions for the next requests."""

    def __init__(self, mode="vllm", failures=(), move_counters=True):
        self.mode, self.failures, self.move = mode, list(failures), move_counters
        self.drafts = self.accepted = 0
        self.per_pos = [0, 0]
        self.requests, self.bodies = 0, []
        self.lock = threading.Lock()

    def metrics(self):
        lines = ["# HELP vllm:num_requests_running x", "# TYPE vllm:num_requests_running gauge",
                 'vllm:num_requests_running{engine="0"} 0.0']
        if self.mode == "vllm":
            half = self.drafts // 2  # two engines: the client must sum label sets
            for eng, share in (("0", half), ("1", self.drafts - half)):
                lines.append(f'vllm:spec_decode_num_drafts_total{{engine="{eng}",model_name="fake"}} {share}.0')
            lines += ['vllm:spec_decode_num_drafts_created{engine="0"} 1.7e9',
                      f'vllm:spec_decode_num_draft_tokens_total{{engine="0"}} {2 * self.drafts}.0',
                      f'vllm:spec_decode_num_accepted_tokens_total{{engine="0"}} {self.accepted}.0']
            for i, c in enumerate(self.per_pos):
                lines.append(f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{engine="0",position="{i}"}} {c}.0')
        return "\n".join(lines) + "\n"


def serve(fake):
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *a):
            pass

        def reply(self, code, obj, ctype="application/json"):
            data = obj.encode() if isinstance(obj, str) else json.dumps(obj).encode()
            self.send_response(code)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def fail(self):
            with fake.lock:
                fake.requests += 1
                action = fake.failures.pop(0) if fake.failures else None
            if action == "drop":  # close without any response: the client sees a dropped connection
                self.close_connection = True
                return True
            if action is not None:
                self.reply(action, {"error": "busy"})
                return True
            return False

        def do_GET(self):
            if self.fail():
                return
            if self.path == "/v1/models":
                self.reply(200, {"data": [{"id": "fake"}]})
            elif self.path == "/metrics" and fake.mode != "sglang":
                self.reply(200, fake.metrics(), "text/plain")
            elif self.path == "/server_info" and fake.mode == "sglang":
                self.reply(200, {"internal_states": [{"avg_spec_accept_length": 2.5, "last_gen_throughput": 1.0}]})
            else:
                self.reply(404, {"error": "not found"})

        def do_POST(self):
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            if self.fail():
                return
            with fake.lock:
                fake.bodies.append(body)
                if fake.move:  # two drafts per request: 2 then 1 accepted (K = 2)
                    fake.drafts += 2
                    fake.accepted += 3
                    fake.per_pos[0] += 2
                    fake.per_pos[1] += 1
            msg = {"message": {"role": "assistant", "content": "ok"}, "text": "ok"}
            self.reply(200, {"choices": [msg], "usage": {"completion_tokens": 5}})

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}"


@pytest.fixture
def start():
    servers = []

    def _start(fake):
        server, url = serve(fake)
        servers.append(server)
        return url

    yield _start
    for s in servers:
        s.shutdown()
        s.server_close()


PROMPTS = [EvalPrompt("a", "math", ["1+1?"]), EvalPrompt("b", "math", ["2+2?"]), EvalPrompt("c", "writing", ["hi"])]


def test_bench_server_reads_counter_differences_per_category(start):
    fake, base = Fake(), Fake("plain", move_counters=False)
    url, base_url = start(fake), start(base)
    fake.drafts, fake.accepted, fake.per_pos = 10, 7, [5, 2]  # earlier traffic must not count
    rep = bench_server(url, PROMPTS, baseline_url=base_url, concurrency=2, max_tokens=16, client=FAST)
    o = rep["overall"]
    assert (o["drafts"], o["accepted"], o["accepted_per_position"]) == (6, 9, [6, 3])
    assert o["tau"] == 2.5 and o["acceptance_per_position"] == [1.0, 0.5]
    assert rep["categories"]["math"]["drafts"] == 4 and rep["categories"]["writing"]["drafts"] == 2
    assert o["tokens"] == 15 and o["speedup"] == pytest.approx(o["spec_tokens_per_s"] / o["plain_tokens_per_s"])
    assert rep["config"]["server"] == "vllm" and rep["config"]["k"] == 2
    assert all(b["model"] == "fake" and b["temperature"] == 0.0 and b["max_tokens"] == 16 for b in fake.bodies)
    assert len(base.bodies) == 3 and "math" in format_table(rep)


def test_completions_api_sends_locally_rendered_token_ids(start):
    fake = Fake()
    url = start(fake)
    bench_server(url, PROMPTS[:1], api="completions", render=lambda m: [7, len(m)], ignore_eos=True, client=FAST)
    assert fake.bodies[0]["prompt"] == [7, 1] and fake.bodies[0]["ignore_eos"] is True


def test_multi_turn_sends_the_previous_answer(start):
    fake = Fake()
    url = start(fake)
    bench_server(url, [EvalPrompt("m", "x", ["first?", "second?"])], client=FAST)
    assert [m["content"] for m in fake.bodies[1]["messages"]] == ["first?", "ok", "second?"]


def test_retries_on_5xx_429_and_dropped_connections(start):
    fake = Fake(failures=[503, 429, "drop"])
    url = start(fake)
    out = FAST.post_json(url + "/v1/chat/completions", {"messages": []})
    assert out["usage"]["completion_tokens"] == 5 and fake.requests == 4


def test_gives_up_after_the_retry_budget(start):
    fake = Fake(failures=[500] * 10)
    url = start(fake)
    with pytest.raises(EvalError, match=r"failed after 4 attempts \(last: HTTP 500"):
        FAST.get_json(url + "/v1/models")
    assert fake.requests == 4


def test_client_errors_are_not_retried(start):
    fake = Fake(failures=[400])
    url = start(fake)
    with pytest.raises(EvalError, match="HTTP 400"):
        FAST.get_json(url + "/v1/models")
    assert fake.requests == 1


def test_connection_refused_is_retried_then_reported():
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(EvalError, match="failed after 4 attempts.*is the server up"):
        FAST.get_json(f"http://127.0.0.1:{port}/v1/models")


def test_server_without_spec_counters_is_a_clear_error(start):
    url = start(Fake("plain"))
    with pytest.raises(EvalError, match="no speculative-decoding counters.*--speculative-config"):
        bench_server(url, PROMPTS, client=FAST)


def test_counters_that_do_not_move_are_an_error(start):
    url = start(Fake(move_counters=False))
    with pytest.raises(EvalError, match="did not move"):
        bench_server(url, PROMPTS, client=FAST)


def test_sglang_server_info(start):
    url = start(Fake("sglang"))
    rep = bench_server(url, PROMPTS, client=FAST)
    assert rep["config"]["server"] == "sglang" and rep["overall"]["tau"] == 2.5
    assert rep["overall"]["acceptance_per_position"] == [] and "since server start" in rep["config"]["note"]
    assert "2.500" in format_table(rep)


def test_prometheus_parsing_by_hand():
    text = ('# HELP x y\nvllm:spec_decode_num_drafts_total{engine="0",model_name="m"} 4.0\n'
            'vllm:spec_decode_num_drafts_total{engine="1",model_name="m"} 6.0\n'
            'vllm:spec_decode_num_draft_tokens_total 30\n'
            'vllm:spec_decode_num_accepted_tokens_total{engine="0"} 12.0\n'
            'vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",position="0"} 7.0\n'
            'vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="1",position="0"} 1.0\n'
            'vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",position="2"} 4.0\n')
    assert parse_prometheus(text)[0] == ("vllm:spec_decode_num_drafts_total", {"engine": "0", "model_name": "m"}, 4.0)
    c = vllm_spec_counters(text)
    assert c == {"drafts": 10.0, "draft_tokens": 30.0, "accepted": 12.0, "per_position": {0: 8.0, 2: 4.0}}
    assert vllm_spec_counters("vllm:num_requests_running 0\n") is None
