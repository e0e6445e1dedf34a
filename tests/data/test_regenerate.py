"""`draftsmith regenerate`: every assistant turn becomes the target's greedy answer to the context of
the regenerated turns before it (hf, vLLM, and an OpenAI server on 127.0.0.1), a kill -9 then rerun
gives the file set of an uninterrupted run, and a changed setting refuses to resume, by name."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import torch

from draftsmith.data.regenerate import RegenError, RegenMismatch, RegenSettings, prompt_segments, regenerate
from draftsmith.data.regenerated import shard_rows, template_kwargs_of
from draftsmith.data.sources import load_conversations
from fixtures import artifacts, make_tiny_llama, write_jsonl

ROOT = Path(__file__).resolve().parents[2]
CONVS = [
    {"messages": [{"role": "system", "content": "Be brief."},
                  {"role": "user", "content": "What is the capital of France?"},
                  {"role": "assistant", "content": "Paris, written by another model."},
                  {"role": "user", "content": "Tell me a joke about cats."},
                  {"role": "assistant", "content": "An answer that must disappear."}]},
    {"conversations": [{"from": "human", "value": "How many legs does a spider have?"},
                       {"from": "gpt", "value": "Eight."}]},
    {"messages": [{"role": "user", "content": "Write a haiku about the sea."}]},  # unanswered: answered now
]


@pytest.fixture(scope="module")
def target(tmp_path_factory) -> Path:
    return make_tiny_llama(tmp_path_factory.mktemp("regen") / "target", num_layers=2)


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    return write_jsonl(tmp_path_factory.mktemp("regen_data") / "chats.jsonl", CONVS)


def greedy(target: Path, messages: list[dict], max_new: int) -> str:
    """The reference: transformers' greedy answer to ``messages`` alone, as text."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(target)
    model = AutoModelForCausalLM.from_pretrained(target, dtype=torch.float32).eval()
    text = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    ids = torch.tensor([tok(text, add_special_tokens=False)["input_ids"]])
    out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new, do_sample=False)
    return tok.decode(out[0, ids.shape[1]:], skip_special_tokens=True)


def rows(out: Path) -> list[dict]:
    return [row for f in sorted(out.glob("shard-*.jsonl")) for row in shard_rows(f)]


def check_against_greedy(target: Path, out: Path, max_new: int) -> None:
    """Each assistant turn equals greedy on the context before it (which holds regenerated turns)."""
    got = rows(out)
    assert len(got) == 3
    for row in got:
        msgs = row["messages"]
        answers = [i for i, m in enumerate(msgs) if m["role"] == "assistant"]
        assert answers, row
        for i in answers:
            assert msgs[i]["content"] == greedy(target, msgs[:i], max_new), (row["id"], i)
    first = got[0]["messages"]
    assert [m["role"] for m in first] == ["system", "user", "assistant", "user", "assistant"]
    assert "another model" not in first[2]["content"] and "disappear" not in first[4]["content"]
    assert [m["role"] for m in got[2]["messages"]] == ["user", "assistant"]


def test_answers_with_unicode_line_separators_are_counted_and_read_back(target, data, tmp_path):
    """json.dumps(ensure_ascii=False) leaves U+2028 raw: a shard must be split at "\\n" only."""
    class Odd:
        name = "odd"

        def prompt_length(self, conversation):
            return 1

        def generate(self, conversations, seeds):
            return [("line one\u2028line two\x85three", 3) for _ in conversations]

        def close(self):
            pass

    out = tmp_path / "odd"
    r = regenerate([str(data)], out, str(target), RegenSettings(engine="hf"), generator=Odd(), progress=False,
                   log=lambda s: None)
    assert r.rows == 3 and r.manifest["counts"]["assistant_turns"] == 4
    convs, report = load_conversations([str(out)])
    assert report.bad == 0 and convs[0][2]["content"] == "line one\u2028line two\x85three"


def test_segments_drop_old_answers_and_optionally_the_system_prompt():
    msgs = CONVS[0]["messages"]
    head, segs = prompt_segments(msgs, "keep")
    assert head == msgs[:1] and [s[0]["content"] for s in segs] == [msgs[1]["content"], msgs[3]["content"]]
    head, segs = prompt_segments(msgs, "drop")
    assert head == [] and len(segs) == 2


def test_hf_answers_equal_greedy_turn_by_turn(target, data, tmp_path):
    out = tmp_path / "regen"
    r = regenerate([str(data)], out, str(target), RegenSettings(engine="hf", max_new_tokens=5, shard_size=2),
                   dtype="float32", progress=False, log=lambda s: None)
    assert (r.rows, r.shards, r.shards_done_before) == (3, 2, 0)
    check_against_greedy(target, out, 5)
    m = json.loads((out / "manifest.json").read_text())
    assert m["complete"] and m["counts"]["assistant_turns"] == 4 and m["settings"]["max_new_tokens"] == 5
    assert m["settings"]["target"]["config_sha256"] and m["settings"]["source_fingerprint"]
    # the output dir is a data source (its shards, not its manifest), in order
    convs, report = load_conversations([str(out)])
    assert report.bad == 0 and [c[-1]["content"] for c in convs] == [r["messages"][-1]["content"] for r in rows(out)]
    # a rerun reuses every shard and changes nothing
    before = {f.name: f.read_bytes() for f in out.iterdir()}
    again = regenerate([str(data)], out, str(target), RegenSettings(engine="hf", max_new_tokens=5, shard_size=2),
                       dtype="float32", progress=False, log=lambda s: None)
    assert again.shards_done_before == 2 and again.new_tokens == 0
    assert {f.name: f.read_bytes() for f in out.iterdir()} == before


def test_changed_setting_refuses_by_name(target, data, tmp_path):
    out = tmp_path / "regen"
    s = RegenSettings(engine="hf", max_new_tokens=3, shard_size=8)
    regenerate([str(data)], out, str(target), s, dtype="float32", progress=False, log=lambda s: None)
    with pytest.raises(RegenMismatch, match=r"max_new_tokens 3 -> 4"):
        regenerate([str(data)], out, str(target), RegenSettings(engine="hf", max_new_tokens=4, shard_size=8),
                   dtype="float32", progress=False, log=lambda s: None)
    with pytest.raises(RegenError, match=r"chat_template_kwargs \{\} -> \{\"enable_thinking\": false\}"):
        regenerate([str(data)], out, str(target), RegenSettings(engine="hf", max_new_tokens=3, shard_size=8,
                                                                chat_template_kwargs={"enable_thinking": False}),
                   dtype="float32", progress=False, log=lambda s: None)


def test_template_kwargs_come_from_the_manifest(target, data, tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    kw = {"enable_thinking": False}
    regenerate([str(data)], a, str(target), RegenSettings(engine="hf", max_new_tokens=2, chat_template_kwargs=kw),
               dtype="float32", progress=False, log=lambda s: None)
    regenerate([str(data)], b, str(target), RegenSettings(engine="hf", max_new_tokens=2), dtype="float32",
               progress=False, log=lambda s: None)
    assert template_kwargs_of([str(a), str(data)]) == kw
    assert template_kwargs_of([str(data)]) is None
    with pytest.raises(RegenError, match="different chat-template kwargs"):
        template_kwargs_of([str(a), str(b)])


# ------------------------------------------------------------------------------ --url
class FakeOpenAI(BaseHTTPRequestHandler):
    """/v1/models and /v1/chat/completions answering with the tiny target's greedy text; the first
    completion request fails with HTTP 503 so the client's retry is exercised."""

    target: Path
    seen: list
    failed = False

    def log_message(self, *args):  # keep test output clean
        pass

    def _send(self, code: int, body: dict) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        self._send(200, {"data": [{"id": "tiny"}]})

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if not type(self).failed:
            type(self).failed = True
            return self._send(503, {"error": "warming up"})
        self.seen.append(body)
        text = greedy(self.target, body["messages"], body["max_tokens"])
        self._send(200, {"choices": [{"message": {"role": "assistant", "content": text}}],
                         "usage": {"completion_tokens": body["max_tokens"]}})


def test_url_answers_equal_greedy_with_retries_and_kwargs(target, data, tmp_path):
    handler = type("Handler", (FakeOpenAI,), {"target": target, "seen": [], "failed": False})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        out = tmp_path / "regen"
        url = f"http://127.0.0.1:{server.server_address[1]}"
        r = regenerate([str(data)], out, "tiny", RegenSettings(engine="url", max_new_tokens=4,
                                                               chat_template_kwargs={"enable_thinking": False}),
                       url=url, concurrency=2, progress=False, log=lambda s: None)
    finally:
        server.shutdown()
    assert r.rows == 3 and r.new_tokens == 4 * 4
    check_against_greedy(target, out, 4)
    assert all(b["chat_template_kwargs"] == {"enable_thinking": False} and b["model"] == "tiny" for b in handler.seen)
    assert json.loads((out / "manifest.json").read_text())["settings"]["target"] == {"url": url, "model": None}


# ------------------------------------------------------------------------------ CLI, kill -9
def cli(*argv, **kw) -> subprocess.Popen | subprocess.CompletedProcess:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(ROOT / "src")}
    cmd = [sys.executable, "-m", "draftsmith.cli", "regenerate", *map(str, argv)]
    if kw.get("background"):
        return subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)


@pytest.mark.slow
def test_kill_9_then_rerun_equals_an_uninterrupted_run(target, tmp_path):
    many = write_jsonl(tmp_path / "many.jsonl", [{"messages": [{"role": "user", "content": f"Count to {i} please."}]}
                                                 for i in range(24)])
    args = ["--target", target, "--data", many, "--engine", "hf", "--dtype", "float32", "--max-new-tokens", "24",
            "--shard-size", "2", "--no-progress"]
    whole, killed = tmp_path / "whole", tmp_path / "killed"
    assert cli(*args, "--out", whole).returncode == 0
    p = cli(*args, "--out", killed, background=True)
    deadline = time.monotonic() + 240
    while not (killed / "shard-000001.jsonl").exists() and time.monotonic() < deadline and p.poll() is None:
        time.sleep(0.02)
    p.send_signal(signal.SIGKILL)
    p.wait()
    n_before = len(list(killed.glob("shard-*.jsonl")))
    assert 2 <= n_before < 12, f"the kill landed after {n_before} of 12 shards; the test needs it mid-run"
    r = cli(*args, "--out", killed)
    assert r.returncode == 0, r.stderr[-2000:]
    assert f"{n_before} reused" in r.stdout
    assert [f.name for f in artifacts(killed)] == [f.name for f in artifacts(whole)]
    for f in artifacts(whole):
        assert (killed / f.name).read_bytes() == f.read_bytes(), f.name
    # a changed setting: one line, exit 2, naming it
    bad = cli(*args[:-1], "--temperature", "0.7", "--out", killed)
    assert bad.returncode == 2 and "temperature 0.0 -> 0.7" in bad.stderr and bad.stderr.count("\n") == 1, bad.stderr


@pytest.mark.slow
def test_two_ranks_write_the_files_of_one_process_and_resume(target, tmp_path):
    """torchrun: shard i is rank i % 2's, rank 0 merges one manifest; the files equal one process's.
    Then the state a kill leaves (shards of both ranks gone, the manifest not complete, a stray
    temporary) is finished by the same 2-rank command without touching the shards on disk."""
    from torchrun_helpers import assert_same_dirs, env, one_process, run_job, torchrun

    many = write_jsonl(tmp_path / "many.jsonl", [{"messages": [{"role": "user", "content": f"Count to {i} please."}]}
                                                 for i in range(8)])
    args = ["regenerate", "--target", target, "--data", many, "--engine", "hf", "--dtype", "float32",
            "--max-new-tokens", "8", "--shard-size", "2", "--no-progress"]
    one, two = tmp_path / "one", tmp_path / "two"
    r = subprocess.run(one_process(*args, "--out", one), env=env(), capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    r = run_job(torchrun(2, *args, "--out", two), env())
    assert r.returncode == 0, r.stderr[-3000:]
    assert_same_dirs(two, one)  # manifest included: shards listed once, in order
    assert r.stdout.count("regenerated 8 conversations") == 1  # the summary comes from rank 0 alone
    manifest = json.loads((two / "manifest.json").read_text())
    (two / "manifest.json").write_text(json.dumps({**manifest, "complete": False, "shards": []}, indent=2) + "\n")
    for i in (1, 2):
        (two / f"shard-00000{i}.jsonl").unlink()
    (two / "shard-000001.jsonl.tmp").write_text("half a shard")
    kept = {f.name: f.stat().st_ino for f in two.glob("shard-*.jsonl")}
    r = run_job(torchrun(2, *args, "--out", two), env())
    assert r.returncode == 0, r.stderr[-3000:]
    assert "2 reused" in r.stdout and {name: (two / name).stat().st_ino for name in kept} == kept
    assert_same_dirs(two, one)


def test_cli_bad_input_is_one_line(target, data, tmp_path):
    r = cli("--target", target, "--data", data, "--out", tmp_path / "o", "--engine", "hf",
            "--chat-template-kwargs", "{not json")
    assert r.returncode == 2 and "--chat-template-kwargs" in r.stderr and r.stderr.count("\n") == 1, r.stderr
    r = cli("--target", target, "--data", tmp_path / "missing.jsonl", "--out", tmp_path / "o", "--engine", "hf")
    assert r.returncode == 2 and "missing.jsonl" in r.stderr and r.stderr.count("\n") == 1, r.stderr


@pytest.mark.vllm
@pytest.mark.slow
def test_vllm_sampled_answers_run_on_the_cpu_and_repeat_with_the_seed(target, tmp_path):
    """12 prompts of ~440 tokens overflow vLLM's 4,096-token step budget, so with chunked prefill one is
    prefilled in part, and vLLM rewinds that request's seeded generator, which a CPU generator cannot
    (the engine died: "CPU Generator does not use offset"). regenerate turns chunked prefill off for
    sampled runs on the CPU: both runs finish, answer every prompt, and the seeds make them equal."""
    pytest.importorskip("vllm")
    words = " ".join(f"apple{j}" for j in range(60))
    long = write_jsonl(tmp_path / "long.jsonl", [{"messages": [{"role": "user", "content": f"Count to {i}. {words}"}]}
                                                 for i in range(12)])
    args = ["--target", target, "--data", long, "--engine", "vllm", "--dtype", "float32", "--max-new-tokens", "8",
            "--max-prompt-tokens", "500", "--temperature", "1.0", "--seed", "3", "--no-progress"]
    outs = [tmp_path / "one", tmp_path / "two"]
    for out in outs:
        r = cli(*args, "--out", out)
        assert r.returncode == 0, r.stderr[-3000:]
    one, two = rows(outs[0]), rows(outs[1])
    assert len(one) == 12 and all(row["messages"][-1]["role"] == "assistant" for row in one)
    assert [row["messages"] for row in one] == [row["messages"] for row in two]
    # sampled, not greedy: a random tiny target's greedy answer differs from a temperature-1 draw somewhere
    assert any(row["messages"][-1]["content"] != greedy(target, row["messages"][:-1], 8) for row in one[:4])


def test_sampling_on_the_cpu_turns_chunked_prefill_off_and_the_budget_holds_a_whole_prompt():
    from draftsmith.data.generators import cpu_sampling_kwargs

    assert cpu_sampling_kwargs(0.0, {"max_model_len": 2048}, on_cpu=True) == {}  # greedy draws nothing
    assert cpu_sampling_kwargs(0.8, {"max_model_len": 2048}, on_cpu=False) == {}  # CUDA generators rewind
    assert cpu_sampling_kwargs(0.8, {"max_model_len": 2048}, on_cpu=True) == {
        "enable_chunked_prefill": False, "max_num_batched_tokens": 4096}
    assert cpu_sampling_kwargs(0.8, {"max_model_len": 8192, "max_num_batched_tokens": 512}, on_cpu=True) == {
        "enable_chunked_prefill": False, "max_num_batched_tokens": 8192}


@pytest.mark.vllm
@pytest.mark.slow
def test_vllm_answers_equal_greedy_turn_by_turn(target, data, tmp_path):
    pytest.importorskip("vllm")
    out = tmp_path / "regen"
    r = cli("--target", target, "--data", data, "--out", out, "--engine", "vllm", "--dtype", "float32",
            "--max-new-tokens", "5", "--max-prompt-tokens", "400", "--no-progress")
    assert r.returncode == 0, r.stderr[-3000:]
    check_against_greedy(target, out, 5)
