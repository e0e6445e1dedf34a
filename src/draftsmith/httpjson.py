"""JSON over HTTP with retries, on the standard library only (urllib).

Shared by ``draftsmith regenerate --engine url`` (data/) and ``bench-server`` (eval/), so it sits
below both: neither imports the other to reach a server. Each caller passes its own user error
(``error``), so a failed request ends its command the way its other input errors do (one line,
exit 2), naming the URL and what to check.
"""

from __future__ import annotations

import http.client
import json
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import Any, Optional


class HttpError(ValueError):
    """An HTTP request the server refused (4xx), or that still failed after every retry (connection
    errors, 5xx, 429); the message names the URL and the server's answer. Fix: check that the server at
    that URL is up and accepts the request; callers raise their own error class instead (``error=``)."""


@dataclass
class HttpClient:
    """JSON over HTTP with retries: connection errors, 5xx and 429 are retried ``retries`` times,
    sleeping ``backoff_s * 2**attempt`` (capped at ``max_backoff_s``) or the server's Retry-After.
    A failure raises ``error`` (default :class:`HttpError`)."""

    retries: int = 5
    backoff_s: float = 0.5
    max_backoff_s: float = 8.0
    timeout_s: float = 600.0
    error: type[Exception] = HttpError

    def request(self, method: str, url: str, body: Optional[dict] = None) -> bytes:
        """The response body of ``method url`` (``body`` sent as JSON), after retries."""
        data = json.dumps(body).encode() if body is not None else None
        last = ""
        for attempt in range(self.retries + 1):
            wait = min(self.max_backoff_s, self.backoff_s * 2 ** attempt)
            try:
                req = urllib.request.Request(url, data=data, method=method,
                                             headers={"Content-Type": "application/json"})
                with urllib.request.urlopen(req, timeout=self.timeout_s) as resp:
                    return resp.read()
            except urllib.error.HTTPError as e:  # before URLError: HTTPError is a subclass
                detail = e.read()[:300].decode(errors="replace")
                if e.code != 429 and e.code < 500:
                    raise self.error(f"{method} {url}: HTTP {e.code} {detail!r}; "
                                     "check the URL, model name and request") from None
                last = f"HTTP {e.code} {detail[:120]!r}"
                retry_after = e.headers.get("Retry-After") if e.headers else None
                if retry_after and retry_after.strip().isdigit():
                    wait = min(self.max_backoff_s, float(retry_after))
            except (urllib.error.URLError, ConnectionError, http.client.HTTPException, TimeoutError) as e:
                last = f"{type(e).__name__}: {getattr(e, 'reason', e)}"
            if attempt < self.retries:
                time.sleep(wait)
        raise self.error(f"{method} {url}: failed after {self.retries + 1} attempts (last: {last}); "
                         "is the server up and reachable?")

    def get_json(self, url: str) -> Any:
        """``GET url``, parsed as JSON."""
        return json.loads(self.request("GET", url))

    def post_json(self, url: str, body: dict) -> Any:
        """``POST url`` with ``body`` as JSON, the reply parsed as JSON."""
        return json.loads(self.request("POST", url, body))
