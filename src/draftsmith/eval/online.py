"""``bench-server``: send a prompt set to running OpenAI-compatible servers and read their
speculative-decoding counters.

- vLLM: Prometheus ``/metrics`` read before and after each category's requests; the differences of
  ``vllm:spec_decode_num_drafts_total``, ``..._num_draft_tokens_total``, ``..._num_accepted_tokens_total``
  and ``..._num_accepted_tokens_per_pos_total{position=i}`` (summed over engines/models) give
  tau = 1 + accepted/drafts and the per-position acceptance, exactly vLLM's own definitions.
- SGLang: ``/server_info`` (older builds: ``/get_server_info``) exposes only
  ``internal_states[0].avg_spec_accept_length``, a running average since the server started, so the
  report carries that tau without per-position rates (use a freshly started server).
- ``--baseline-url``: the same prompts against a server without speculation; speedup = ratio of
  generated tokens/s measured the same way (wall time of the whole category, same concurrency).

Requests retry on connection errors, HTTP 5xx and 429 with exponential backoff (Retry-After honoured).
Only the standard library is used (urllib + threads; the client is :mod:`draftsmith.httpjson`).
"""

from __future__ import annotations

import re
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Callable, Optional, Sequence

from draftsmith.eval import EvalError
from draftsmith.eval.prompts import EvalPrompt
from draftsmith.eval.report import counter_stats
from draftsmith.httpjson import HttpClient as JsonClient

VLLM_PREFIX = "vllm:spec_decode_num_"
_SAMPLE = re.compile(r'^([A-Za-z_:][\w:]*)(?:\{([^}]*)\})?\s+(\S+)')
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


@dataclass
class HttpClient(JsonClient):
    """:class:`draftsmith.httpjson.HttpClient` whose failures are :class:`EvalError`, as every other
    bad ``bench-server`` input is (one line, exit 2)."""

    error: type[Exception] = EvalError


# ---------------------------------------------------------------------------------- counters
def parse_prometheus(text: str) -> list[tuple[str, dict, float]]:
    """Prometheus text exposition -> [(name, labels, value)] (comments and blank lines skipped)."""
    out = []
    for line in text.splitlines():
        m = _SAMPLE.match(line.strip())
        if m and not line.startswith("#"):
            labels = dict(_LABEL.findall(m.group(2) or ""))
            try:
                out.append((m.group(1), labels, float(m.group(3))))
            except ValueError:
                continue
    return out


def vllm_spec_counters(text: str) -> Optional[dict]:
    """vLLM spec-decode counters summed over engines/models, or None when the server has none:
    {"drafts", "draft_tokens", "accepted", "per_position": {position: accepted}}."""
    found, c = False, {"drafts": 0.0, "draft_tokens": 0.0, "accepted": 0.0, "per_position": {}}
    names = {f"{VLLM_PREFIX}drafts_total": "drafts", f"{VLLM_PREFIX}draft_tokens_total": "draft_tokens",
             f"{VLLM_PREFIX}accepted_tokens_total": "accepted"}
    for name, labels, value in parse_prometheus(text):
        if name in names:
            found = True
            c[names[name]] += value
        elif name == f"{VLLM_PREFIX}accepted_tokens_per_pos_total":
            pos = int(labels.get("position", 0))
            c["per_position"][pos] = c["per_position"].get(pos, 0.0) + value
    return c if found else None


def counter_diff(before: dict, after: dict) -> dict:
    """after - before for every counter (per-position keys from either side)."""
    keys = sorted(set(before["per_position"]) | set(after["per_position"]))
    return {**{key: after[key] - before[key] for key in ("drafts", "draft_tokens", "accepted")},
            "per_position": {k: after["per_position"].get(k, 0.0) - before["per_position"].get(k, 0.0) for k in keys}}


class SpecSource:
    """Reads a server's speculative-decoding state: ``kind`` is "vllm" or "sglang"."""

    def __init__(self, client: HttpClient, url: str):
        self.client, self.url = client, url.rstrip("/")
        self.kind, self.path = self._probe()

    def _probe(self) -> tuple[str, str]:
        tried = []
        try:
            text = self.client.request("GET", self.url + "/metrics").decode()
            if vllm_spec_counters(text) is not None:
                return "vllm", "/metrics"
            tried.append("/metrics has no vllm:spec_decode_* counters")
        except EvalError as e:
            tried.append(str(e))
        for path in ("/server_info", "/get_server_info"):
            try:
                info = self.client.get_json(self.url + path)
            except (EvalError, ValueError) as e:
                tried.append(f"{path}: {str(e)[:100]}")
                continue
            states = info.get("internal_states") if isinstance(info, dict) else None
            if states and isinstance(states[0], dict) and states[0].get("avg_spec_accept_length") is not None:
                return "sglang", path
            tried.append(f"{path} has no internal_states[0].avg_spec_accept_length")
        raise EvalError(f"{self.url}: no speculative-decoding counters ({'; '.join(tried)}); start the server with "
                        "speculative decoding (vLLM --speculative-config, SGLang --speculative-algorithm), "
                        "or pass a plain server as --baseline-url")

    def read(self) -> dict:
        if self.kind == "vllm":
            return vllm_spec_counters(self.client.request("GET", self.url + self.path).decode()) or {}
        info = self.client.get_json(self.url + self.path)
        return {"avg_spec_accept_length": float(info["internal_states"][0]["avg_spec_accept_length"])}

    def read_settled(self, tries: int = 10, pause_s: float = 0.2) -> dict:
        """Read until two consecutive reads agree: the last step's stats may land just after its response."""
        prev = self.read()
        for _ in range(tries):
            time.sleep(pause_s)
            cur = self.read()
            if cur == prev:
                return cur
            prev = cur
        return prev


# ---------------------------------------------------------------------------------- requests
def _complete(client: HttpClient, base: str, model: str, p: EvalPrompt, *, api: str, max_tokens: int,
              temperature: float, ignore_eos: bool, render: Optional[Callable[[list[dict]], list[int]]],
              extra: Optional[dict] = None) -> list[dict]:
    """All turns of one prompt, sequentially (each later turn follows the server's answer)."""
    messages, out = list(p.context), []
    for turn, question in enumerate(p.turns):
        messages.append({"role": "user", "content": question})
        body: dict = {"model": model, "max_tokens": max_tokens, "temperature": temperature}
        if ignore_eos:
            body["ignore_eos"] = True  # vLLM / SGLang extension
        body.update(extra or {})
        t0 = time.perf_counter()
        if api == "chat":
            resp = client.post_json(base + "/v1/chat/completions", {**body, "messages": messages})
            text = resp["choices"][0]["message"].get("content") or ""
        else:
            resp = client.post_json(base + "/v1/completions", {**body, "prompt": render(messages)})
            text = resp["choices"][0].get("text") or ""
        n = int((resp.get("usage") or {}).get("completion_tokens", 0))
        out.append({"id": p.id, "category": p.category, "turn": turn, "completion_tokens": n,
                    "latency_s": time.perf_counter() - t0, "text": text})
        if resp["choices"][0].get("token_ids") is not None:  # vLLM with extra {"return_token_ids": true}
            out[-1]["token_ids"] = list(resp["choices"][0]["token_ids"])
        messages.append({"role": "assistant", "content": text})
    return out


def run_prompts(client: HttpClient, url: str, model: str, prompts: Sequence[EvalPrompt], *, concurrency: int = 1,
                **kw) -> tuple[list[dict], float]:
    """Send every prompt (``concurrency`` in flight) -> (records, wall seconds)."""
    t0 = time.perf_counter()
    with ThreadPoolExecutor(max_workers=max(1, concurrency)) as pool:
        results = list(pool.map(lambda p: _complete(client, url.rstrip("/"), model, p, **kw), prompts))
    return [r for rs in results for r in rs], time.perf_counter() - t0


def model_name(client: HttpClient, url: str) -> str:
    """The first model id the server lists at /v1/models."""
    data = client.get_json(url.rstrip("/") + "/v1/models").get("data") or []
    if not data:
        raise EvalError(f"{url}/v1/models lists no model; pass --model")
    return data[0]["id"]


def _row(records: list[dict], wall: float, spec: Optional[dict], k: int, base: Optional[tuple[list, float]]) -> dict:
    tokens = sum(r["completion_tokens"] for r in records)
    if spec is not None and "drafts" in spec:
        per = [spec["per_position"].get(i, 0.0) for i in range(max(k, len(spec["per_position"])))]
        stats = counter_stats(int(spec["drafts"]), int(spec["accepted"]), [int(c) for c in per])
        stats["draft_tokens"] = int(spec["draft_tokens"])
    else:  # SGLang: a running average only
        stats = {"drafts": None, "accepted": None, "accepted_per_position": [], "acceptance_per_position": [],
                 "conditional_acceptance_per_position": [], "tau": spec.get("avg_spec_accept_length") if spec else None}
    rate = tokens / wall if wall > 0 else None
    base_rate = None
    if base is not None:
        base_rate = sum(r["completion_tokens"] for r in base[0]) / base[1] if base[1] > 0 else None
    return {"prompts": len({r["id"] for r in records}), **stats, "tokens": tokens, "spec_tokens_per_s": rate,
            "plain_tokens_per_s": base_rate, "speedup": rate / base_rate if rate and base_rate else None,
            "wall_s": wall}


def bench_server(url: str, prompts: Sequence[EvalPrompt], *, baseline_url: Optional[str] = None,
                 concurrency: int = 1, max_tokens: int = 128, temperature: float = 0.0, ignore_eos: bool = False,
                 model: Optional[str] = None, api: str = "chat", render=None, k: Optional[int] = None,
                 client: Optional[HttpClient] = None, extra: Optional[dict] = None) -> dict:
    """Benchmark ``url`` (and ``baseline_url``) category by category -> report dict (see report.py).

    ``api="completions"`` sends ``render(messages)`` (token ids rendered locally) to /v1/completions,
    so the server sees exactly the tokens the offline evaluator uses; "chat" lets the server render.
    ``extra`` is merged into every request body (e.g. vLLM's ``{"return_token_ids": true}``).
    """
    if api not in ("chat", "completions") or (api == "completions" and render is None):
        raise EvalError(f"--api {api!r}: use 'chat', or 'completions' with --tokenizer to render prompts locally")
    client = client or HttpClient()
    source = SpecSource(client, url)
    name = model or model_name(client, url)
    base_name = (model or model_name(client, baseline_url)) if baseline_url else None
    kw = dict(api=api, max_tokens=max_tokens, temperature=temperature, ignore_eos=ignore_eos, render=render,
              extra=extra)
    categories = sorted({p.category for p in prompts})
    rows, records, total_spec = {}, [], None
    base_all: tuple[list, float] = ([], 0.0)
    for cat in categories:
        group = [p for p in prompts if p.category == cat]
        before = source.read_settled()
        recs, wall = run_prompts(client, url, name, group, concurrency=concurrency, **kw)
        after = source.read_settled()
        spec = counter_diff(before, after) if source.kind == "vllm" else after
        base = None
        if baseline_url:
            base = run_prompts(client, baseline_url, base_name, group, concurrency=concurrency, **kw)
        if base is not None:
            base_all = (base_all[0] + base[0], base_all[1] + base[1])
        kk = k or len(spec.get("per_position", {}))
        rows[cat] = _row(recs, wall, spec, kk, base)
        records += recs
        if source.kind == "vllm":
            total_spec = spec if total_spec is None else {
                **{key: total_spec[key] + spec[key] for key in ("drafts", "draft_tokens", "accepted")},
                "per_position": {i: total_spec["per_position"].get(i, 0.0) + spec["per_position"].get(i, 0.0)
                                 for i in set(total_spec["per_position"]) | set(spec["per_position"])}}
        else:
            total_spec = spec
    wall = sum(r["wall_s"] for r in rows.values())
    kk = k or len((total_spec or {}).get("per_position", {}))
    overall = _row(records, wall, total_spec, kk, base_all if baseline_url else None)
    if overall["drafts"] == 0:
        raise EvalError(f"{url}: the spec-decode counters did not move (0 drafts for {len(records)} requests); "
                        "is speculative decoding enabled for this model?")
    config = {"url": url, "baseline_url": baseline_url, "server": source.kind, "model": name, "api": api,
              "concurrency": concurrency, "max_tokens": max_tokens, "temperature": temperature,
              "ignore_eos": ignore_eos, "k": kk}
    if source.kind == "sglang":
        config["note"] = "SGLang reports avg_spec_accept_length since server start; no per-position rates"
    return {"mode": "online", "config": config, "overall": overall, "categories": rows, "records": records}
