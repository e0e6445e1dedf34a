"""The `remote` engine: the target runs in `draftsmith serve-target` processes, features come over HTTP.

Behaviour (docs/guides/remote.md):
- several servers (``urls``); each has one keep-alive connection and a lock, so at most one request
  is on the wire per server; requests go to a free healthy server, round robin;
- ``prefetch_depth`` supervision requests in flight (:meth:`RemoteEngine.supervision`): the oldest is
  awaited first and only then is the next batch submitted, so results come back in batch order;
- every request is idempotent (features are a pure function of the batch), so connection errors,
  timeouts and 5xx answers mark the server down and the request moves to another healthy server;
  when none is healthy the client sleeps with exponential backoff and re-checks ``/health`` until its
  retry budget is spent, then raises :class:`RemoteError` naming every URL and its last error;
- a down server is re-checked every ``health_interval_s`` and used again once it answers;
- the vocab map is pushed to every server on start (and so on resume, where the trainer pushes the
  checkpoint's map) and again whenever a server answers 409 (a restarted server forgets maps);
- ``close()`` sends ``/disconnect`` to every server; it also runs at interpreter exit;
- ``data_plane`` (``auto`` | ``nccl`` | ``gloo`` | ``wire``): with ``nccl`` (both sides CUDA) or ``gloo``
  the answer to ``/features`` is a header and the tensors follow over a private 2-rank group
  (:mod:`draftsmith.remote.nccl`); a failed handshake falls back to the wire frame for that server,
  a failed transfer counts as a server fault (failover), and the channel is rebuilt when it returns.

Ambient proxy settings (HTTP_PROXY, ...) are ignored on purpose: http.client, unlike urllib, never
reads them, and the servers are addressed directly.
"""

from __future__ import annotations

import atexit
import http.client
import itertools
import json
import os
import socket
import sys
import threading
import time
import uuid
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Iterable, Iterator, Optional, Sequence
from urllib.parse import urlsplit

import torch
from torch import Tensor

from draftsmith.remote import wire
from draftsmith.remote.nccl import Channel, choose_data_plane, cuda_uuid, join_store, nccl_usable, transfer_plan
from draftsmith.remote.server import is_loopback
from draftsmith.targets import Batch, Features, TargetInfo
from draftsmith.targets.contract import TargetError, supervision_from_tensors, supervision_kind, supervision_to


class RemoteError(TargetError):
    """The remote target cannot serve this run: a bad ``target.remote_*`` setting, every server down after
    the retries, a token rejected (401), a request the servers refuse. Fix: start
    ``draftsmith serve-target`` at the URLs it names, or correct the setting or token file it names."""


class _Down(Exception):
    """A server failed in a way worth retrying elsewhere (connection error, timeout, 5xx)."""


class _Server:
    def __init__(self, url: str, timeout_s: float):
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise RemoteError(f"target.remote_urls: {url!r} is not an http(s)://host:port URL")
        self.url, self.scheme, self.host = url, parts.scheme, parts.hostname
        self.port = parts.port or (443 if parts.scheme == "https" else 80)
        self.timeout_s = timeout_s
        self.conn: Optional[http.client.HTTPConnection] = None
        self.lock = threading.Lock()  # one request on the wire per server
        self.healthy, self.retry_at, self.last_error = False, 0.0, "not contacted yet"
        self.vocab_id: Optional[str] = None  # what this server calls our vocab map (None = push needed)
        self.channel: Optional[Channel] = None  # data-plane channel (None = not opened, or the wire)
        self.session: Optional[str] = None  # its session id (kept after a drop: the next handshake ends it)
        self.plane_failed = False  # handshake failed: the wire carries tensors until the server restarts
        self.plane_retry_at = 0.0  # the server was busy with other handshakes (429): the wire until then

    def request(self, method: str, path: str, body: bytes = b"", headers: Optional[dict] = None,
                timeout_s: Optional[float] = None) -> tuple[int, bytearray]:
        """One request on the keep-alive connection (caller holds ``lock``); connection faults -> _Down."""
        try:
            if self.conn is None or self.conn.sock is None:
                cls = http.client.HTTPSConnection if self.scheme == "https" else http.client.HTTPConnection
                self.conn = cls(self.host, self.port, timeout=self.timeout_s)
                self.conn.connect()
                # One small request after another on a keep-alive socket: Nagle would hold them back.
                self.conn.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if timeout_s is not None:
                self.conn.timeout = timeout_s
                self.conn.sock.settimeout(timeout_s)
            self.conn.request(method, path, body=body, headers={"Content-Length": str(len(body)), **(headers or {})})
            resp = self.conn.getresponse()
            data = _read_body(resp)
        except (OSError, http.client.HTTPException) as e:
            self.drop()
            raise _Down(f"{e.__class__.__name__}: {e}") from None
        finally:
            if timeout_s is not None and self.conn is not None:
                self.conn.timeout = self.timeout_s
                if self.conn.sock is not None:
                    self.conn.sock.settimeout(self.timeout_s)
        if resp.status >= 500:
            raise _Down(f"HTTP {resp.status}: {data[:200].decode(errors='replace')}")
        return resp.status, data

    def drop(self) -> None:
        if self.conn is not None:
            self.conn.close()
            self.conn = None


def _read_body(resp: http.client.HTTPResponse) -> bytearray:
    """The whole body, read straight into a bytearray: wire.decode then views it without another copy."""
    if resp.length is None:
        return bytearray(resp.read())
    buf = bytearray(resp.length)
    view, got = memoryview(buf), 0
    while got < len(buf):
        k = resp.readinto(view[got:])
        if not k:
            raise http.client.IncompleteRead(bytes(buf[:got]), len(buf) - got)
        got += k
    return buf


def _redo(data: bytes) -> Optional[str]:
    """What a 409 answer asks to send again (``vocab-map`` or ``data-plane``)."""
    try:
        return json.loads(data).get("redo")
    except (ValueError, AttributeError):
        return None


def _error(status: int, data: bytes) -> str:
    try:
        return json.loads(data).get("error", "")
    except (ValueError, AttributeError):
        return data[:200].decode(errors="replace")


class RemoteEngine:
    """An :class:`~draftsmith.targets.Engine` whose target runs in `serve-target` processes.

    ``target`` names the target for the trainer's tokenizer and logs; the servers decide what runs.
    """

    def __init__(self, target: str = "", *, urls: Sequence[str], dtype: Optional[str] = None,
                 prefetch_depth: int = 1, timeout_s: float = 300.0, retries: int = 5, backoff_s: float = 0.5,
                 max_backoff_s: float = 10.0, health_interval_s: float = 5.0,
                 auth_token_file: Optional[str] = None, data_plane: str = "auto", device: Optional[str] = None):
        if not urls:
            raise RemoteError("target.remote_urls is empty; list the serve-target URLs, e.g. [http://127.0.0.1:8001]")
        if prefetch_depth < 0 or retries < 0:
            raise RemoteError(f"target.prefetch_depth={prefetch_depth}, target.remote_retries={retries}: expected >= 0")
        self.target, self.prefetch_depth, self.retries = target, prefetch_depth, retries
        # where supervision is delivered (the draft's device, train.device): nccl receives there directly;
        # wire tensors are copied there on the prefetch thread, off the training step
        self.device = torch.device(device) if device else None
        self.backoff_s, self.max_backoff_s, self.health_interval_s = backoff_s, max_backoff_s, health_interval_s
        self.servers = [_Server(u, timeout_s) for u in urls]
        self._headers = {}
        if auth_token_file:
            path = Path(auth_token_file)
            if not path.is_file():
                raise RemoteError(f"target.remote_auth_token_file: '{path}' does not exist; write the token into it")
            self._headers["Authorization"] = f"Bearer {path.read_text().strip()}"
        self._pick_lock, self._rr = threading.Lock(), itertools.count()
        self._draft_ids: Optional[Tensor] = None
        self._vocab_set = False
        self._weights: Optional[dict] = None
        self._closed = False
        self._pool = ThreadPoolExecutor(max_workers=prefetch_depth, thread_name_prefix="remote") if prefetch_depth else None
        atexit.register(self.close)
        try:
            # Probe every server once; the run starts when at least one answers (others are re-checked later).
            self._info_raw = self._with_failover(lambda s: self._get_json(s, "/info"), "GET /info")
            for s in self.servers:
                if s.healthy:
                    with s.lock:
                        try:
                            other = self._get_json(s, "/info")
                        except _Down as e:
                            s.healthy, s.last_error = False, str(e)
                            continue  # re-checked later like any down server
                    if _static(other) != _static(self._info_raw):
                        raise RemoteError(f"target.remote_urls: {s.url} serves a different target than the others "
                                          f"({_static(other)} vs {_static(self._info_raw)}); point all URLs at one target")
            self.server_aux_ids = list(self._info_raw["aux_layer_ids"])
            offered = self._info_raw.get("data_planes", ["wire"])
            # Channels are built on pool threads (current device 0 there): receive on this thread's GPU.
            gpu = self.device if self.device is not None and self.device.type == "cuda" else None
            self._cuda_device = (gpu or torch.device("cuda", torch.cuda.current_device())) if nccl_usable() else None
            same_gpu = self._cuda_device is not None and self._info_raw.get("cuda_uuid") == cuda_uuid(self._cuda_device)
            try:
                self.plane, self.plane_reason = choose_data_plane(
                    data_plane, self._cuda_device is not None, bool(self._info_raw.get("cuda")) and "nccl" in offered, offered, same_gpu)
            except ValueError as e:
                raise RemoteError(f"target.remote_data_plane: {e}") from None
            if self.plane == "nccl" and all(is_loopback(urlsplit(s.url).hostname or "") for s in self.servers):
                # NCCL leaves lo out when it picks an interface; loopback servers are only reachable there
                # (serve-target on loopback sets the same for its side).
                os.environ.setdefault("NCCL_SOCKET_IFNAME", "lo")
            if self.plane == "wire" and data_plane not in ("auto", "wire"):
                print(f"remote target: data plane {data_plane} not used ({self.plane_reason}); tensors travel over HTTP",
                      file=sys.stderr, flush=True)
            if dtype is not None and dtype != self._info_raw["dtype"]:
                raise RemoteError(f"target.dtype: {dtype!r} but the servers run the target in {self._info_raw['dtype']!r}; "
                                  f"set target.dtype to {self._info_raw['dtype']!r} or restart serve-target with --dtype {dtype}")
        except BaseException:
            self.close()  # /disconnect whatever answered; nothing is left running
            raise

    # ------------------------------------------------------------------ server choice, retries, failover
    def _probe(self, s: _Server) -> None:
        """Health re-check of a down server (caller holds its lock)."""
        try:
            status, data = s.request("GET", "/health", headers=self._headers, timeout_s=min(s.timeout_s, 5.0))
            if status == 200:
                s.healthy, s.vocab_id = True, None  # it may have restarted: push the vocab map again
                self._drop_channel(s)  # ... and open a new data-plane session
                s.plane_failed = False
                return
            self._check(s, status, data, "GET /health")  # raises: a 401 or a non-draftsmith answer is not transient
        except _Down as e:
            s.last_error = str(e)
        s.retry_at = time.monotonic() + self.health_interval_s

    def _acquire(self) -> Optional[_Server]:
        """A healthy server with its lock held (a free one if any), or None when none is healthy."""
        now = time.monotonic()
        for s in self.servers:
            if not s.healthy and now >= s.retry_at and s.lock.acquire(blocking=False):
                try:
                    self._probe(s)
                finally:
                    s.lock.release()
        with self._pick_lock:
            healthy = [s for s in self.servers if s.healthy]
            if not healthy:
                return None
            k = next(self._rr) % len(healthy)
            order = healthy[k:] + healthy[:k]
        for s in order:
            if s.lock.acquire(blocking=False):
                return s
        order[0].lock.acquire()
        return order[0]

    def _with_failover(self, fn, what: str):
        """Run ``fn(server)`` on a healthy server; on a fault mark it down and try the next one."""
        failures, delay = 0, self.backoff_s
        while True:
            s = self._acquire()
            if s is not None:
                try:
                    if s.healthy:
                        return fn(s)
                except _Down as e:
                    s.healthy, s.last_error = False, str(e)
                    s.retry_at = time.monotonic() + self.health_interval_s
                    s.drop()
                    self._drop_channel(s)
                finally:
                    s.lock.release()
            failures += 1
            if failures > self.retries:
                states = "; ".join(f"{x.url}: {x.last_error}" for x in self.servers)
                raise RemoteError(f"remote target: {what} failed on every server after {self.retries} retries "
                                  f"({states}); start `draftsmith serve-target` again and resume from the checkpoint")
            if not any(x.healthy for x in self.servers):
                time.sleep(delay)  # nobody left: back off, then re-check health
                delay = min(delay * 2, self.max_backoff_s)
                for x in self.servers:
                    x.retry_at = min(x.retry_at, time.monotonic())

    def _get_json(self, s: _Server, path: str) -> dict:
        status, data = s.request("GET", path, headers=self._headers)
        self._check(s, status, data, f"GET {path}")
        s.healthy = True
        return json.loads(data)

    def _check(self, s: _Server, status: int, data: bytes, what: str) -> None:
        if status == 401:
            raise RemoteError(f"{s.url}{what.split(' ', 1)[1]}: token rejected (401); set target.remote_auth_token_file "
                              f"to the file serve-target was given")
        if status != 200:
            raise RemoteError(f"{s.url}: {what} answered {status}: {_error(status, data)}")

    def _post_frame(self, s: _Server, path: str, body: bytes) -> tuple[int, bytes]:
        return s.request("POST", path, body, {**self._headers, "Content-Type": "application/octet-stream"})

    def _push_vocab(self, s: _Server) -> None:
        if self._draft_ids is None:
            body = wire.encode({}, {"full_vocab": True})
        else:
            body = wire.encode({"draft_ids": self._draft_ids})
        status, data = self._post_frame(s, "/vocab-map", body)
        self._check(s, status, data, "POST /vocab-map")
        s.vocab_id = json.loads(data)["vocab_id"]

    # ------------------------------------------------------------------ data plane
    def _channel(self, s: _Server) -> Optional[Channel]:
        """``s``'s data-plane channel, opened on first use (caller holds ``s.lock``); None = the wire."""
        if self.plane == "wire" or s.plane_failed or time.monotonic() < s.plane_retry_at:
            return None
        if s.channel is None:
            sid = uuid.uuid4().hex
            body = json.dumps({"session": sid, "plane": self.plane, "previous": s.session}).encode()
            status, data = s.request("POST", "/data-plane", body, {**self._headers, "Content-Type": "application/json"})
            if status == 401:
                self._check(s, status, data, "POST /data-plane")
            if status == 429:  # busy, not broken: the wire for now, another handshake later
                s.plane_retry_at = time.monotonic() + PLANE_BUSY_RETRY_S
                return None
            if status != 200:
                return self._plane_fallback(s, f"POST /data-plane answered {status}: {_error(status, data)}")
            s.session, channel = sid, None  # known from here on: the next handshake or /disconnect ends it
            try:
                port = int(json.loads(data)["store_port"])
                local = s.conn.sock.getsockname()[0]  # the address our HTTP connection to s uses
                join_s = min(s.timeout_s, 60.0)  # the server is already waiting for us
                channel = Channel(self.plane, join_store(s.host, port, join_s), 1, s.timeout_s, local, self._cuda_device)
                channel.recv_probe()  # the server's first send: the group works (and NCCL is initialised)
            except Exception as e:
                if channel is not None:
                    channel.close()
                return self._plane_fallback(s, f"{e.__class__.__name__}: {str(e)[:200]}")
            s.channel = channel
        return s.channel

    def _plane_fallback(self, s: _Server, reason: str) -> None:
        s.plane_failed = True
        print(f"remote target: {s.url}: {self.plane} data plane not opened ({reason}); tensors travel over HTTP "
              f"for this server", file=sys.stderr, flush=True)
        return None

    def _drop_channel(self, s: _Server) -> None:
        if s.channel is not None:
            s.channel.close()
            s.channel = None

    def _features_call(self, s: _Server, tensors: dict, meta: dict) -> dict:
        """POST /features to ``s`` (caller holds its lock); the answer's tensors, from the frame or the channel."""
        needs_vocab = meta.get("mode") == "supervision" and supervision_kind(meta["kind"]).vocab
        for _ in range(3):  # a 409: the server lost our session and/or vocab map (restart): redo what it names
            channel = self._channel(s)
            if needs_vocab and s.vocab_id is None:
                self._push_vocab(s)
            m = {**meta, **({"vocab_id": s.vocab_id} if needs_vocab else {}), **({"session": s.session} if channel else {})}
            status, data = self._post_frame(s, "/features", wire.encode(tensors, m))
            if status != 409:
                break
            if _redo(data) == "data-plane":
                self._drop_channel(s)
            else:  # "vocab-map"
                s.vocab_id = None
        self._check(s, status, data, "POST /features")
        frame = wire.decode(data, _CLIENT_LIMITS)
        if "transfer" not in frame.meta:
            return frame.tensors
        if channel is None:
            raise RemoteError(f"{s.url}: POST /features announced a data-plane transfer without a session; "
                              f"client and server versions disagree")
        try:
            plan = transfer_plan(frame.meta["transfer"], _CLIENT_LIMITS.max_elements)
            with channel.lock:
                return channel.recv(plan)
        except Exception as e:  # a dead or silent server: fail over like any connection fault
            self._drop_channel(s)
            raise _Down(f"{channel.backend} data plane: {e.__class__.__name__}: {str(e)[:200]}") from None

    # ------------------------------------------------------------------ Engine contract
    def info(self) -> TargetInfo:
        fields = TargetInfo.__dataclass_fields__
        return TargetInfo(**{k: v for k, v in self._info_raw.items() if k in fields})

    def set_vocab_map(self, draft_ids: Optional[Tensor]) -> None:
        """Use ``draft_ids`` (Vd,) int64 (None = full vocab) and push it to every reachable server now."""
        self._draft_ids = None if draft_ids is None else draft_ids.detach().to("cpu", torch.int64).contiguous()
        self._vocab_set = True
        for s in self.servers:
            s.vocab_id = None
            if s.healthy and s.lock.acquire(timeout=s.timeout_s):
                try:
                    self._push_vocab(s)
                except _Down as e:
                    s.healthy, s.last_error, s.retry_at = False, str(e), time.monotonic() + self.health_interval_s
                finally:
                    s.lock.release()

    def supervise(self, kind: str, batch: Batch, layer_ids: Sequence[int]) -> Any:
        """Supervision of ``kind`` for ``batch``, computed by a server (see contract.SUPERVISION)."""
        k = supervision_kind(kind)
        if kind not in self._info_raw.get("supervision_kinds", ()):
            raise RemoteError(f"remote target: the servers compute supervision kinds {self._info_raw.get('supervision_kinds', [])}, "
                              f"not {kind!r}; restart serve-target from this draftsmith version")
        if k.vocab and not self._vocab_set:
            raise RemoteError("remote engine: call set_vocab_map(draft_ids) before requesting supervision")
        tensors = {"input_ids": batch.input_ids, "attention_mask": batch.attention_mask, "loss_mask": batch.loss_mask}
        meta = {"mode": "supervision", "kind": kind, "layer_ids": list(layer_ids)}
        sup = self._with_failover(lambda s: supervision_from_tensors(kind, self._features_call(s, tensors, meta)),
                                  "POST /features")
        return sup if self.device is None else supervision_to(sup, self.device)

    def supervision(self, kind: str, batches: Iterable[Batch], layer_ids: Sequence[int]) -> Iterator[tuple[Batch, Any]]:
        """``(batch, supervision of kind)`` in batch order, with up to ``prefetch_depth`` requests in flight."""
        if self._pool is None:
            for b in batches:
                yield b, self.supervise(kind, b, layer_ids)
            return
        it, pending = iter(batches), deque()
        try:
            for b in itertools.islice(it, self.prefetch_depth):
                pending.append((b, self._pool.submit(self.supervise, kind, b, layer_ids)))
            while pending:
                b, fut = pending.popleft()
                sup = fut.result()  # await the oldest first ...
                nxt = next(it, None)  # ... and only then refill, so at most prefetch_depth are in flight
                if nxt is not None:
                    pending.append((nxt, self._pool.submit(self.supervise, kind, nxt, layer_ids)))
                yield b, sup
        finally:
            for _, fut in pending:  # an early stop abandons the prefetched requests
                fut.cancel()

    def features(self, batch: Batch, layer_ids: Sequence[int], *, logits: bool) -> Features:
        """Raw features (aux states, and full-vocab logits when asked: large, prefer :meth:`supervise`)."""
        tensors = {"input_ids": batch.input_ids, "attention_mask": batch.attention_mask, "loss_mask": batch.loss_mask}
        meta = {"mode": "features", "logits": bool(logits), "layer_ids": list(layer_ids)}

        def call(s: _Server) -> Features:
            t = self._features_call(s, tensors, meta)
            return Features(aux_hidden=t["aux_hidden"], logits=t.get("logits"))

        return self._with_failover(call, "POST /features")

    def _fetch_weights(self) -> dict:
        if self._weights is None:
            def call(s: _Server) -> dict:
                status, data = s.request("GET", "/embeddings", headers=self._headers)
                self._check(s, status, data, "GET /embeddings")
                return wire.decode(data, _CLIENT_LIMITS).tensors

            self._weights = self._with_failover(call, "GET /embeddings")
        return self._weights

    def embeddings(self) -> Tensor:
        """(V, H) input embedding of the target."""
        return self._fetch_weights()["embeddings"]

    def _head(self, method: str, key: str) -> Tensor:
        w = self._fetch_weights()
        if "final_norm" not in w:  # servers send lm_head/final_norm only when their engine has them
            raise RemoteError(f"remote target: the servers' engine exposes no lm_head/final norm, so {method}() is "
                              f"unavailable; set draft.init_from_target: false or serve the target with the hf engine")
        return w[key]

    def lm_head_weight(self) -> Tensor:
        """(V, H) output projection of the target (a tied target's is its embeddings, sent once)."""
        return self._head("lm_head_weight", "lm_head" if "lm_head" in self._fetch_weights() else "embeddings")

    def final_norm_weight(self) -> Tensor:
        """(H,) final norm weight of the target."""
        return self._head("final_norm_weight", "final_norm")

    def close(self) -> None:
        """Send ``/disconnect`` to every server (best effort, short timeout) and release connections."""
        if self.__dict__.get("_closed", True):
            return
        self._closed = True
        atexit.unregister(self.close)
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
        for s in self.servers:
            if s.lock.acquire(timeout=5.0):
                try:
                    body = json.dumps({"session": s.session}).encode() if s.session else b""
                    s.request("POST", "/disconnect", body, self._headers, timeout_s=2.0)
                except _Down:
                    pass
                finally:
                    self._drop_channel(s)
                    s.drop()
                    s.lock.release()

    def __enter__(self) -> "RemoteEngine":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


PLANE_BUSY_RETRY_S = 30.0  # after a 429 from /data-plane, the next handshake attempt waits this long
_CLIENT_LIMITS = wire.Limits(max_body=1 << 40, max_elements=1 << 40)  # answers come from servers we chose


def _static(info: dict) -> tuple:
    return tuple(info.get(k) for k in ("num_layers", "hidden_size", "vocab_size", "dtype", "model_type"))
