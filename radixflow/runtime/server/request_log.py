"""--log-requests (SGLang's flag): one log line a finished request, with more of it by --log-requests-level."""

from __future__ import annotations

import dataclasses
import json
import logging
from typing import Any

from radixflow.runtime.sglang_flags import LOG_TEXT_CHARS

log = logging.getLogger("radixflow.requests")


def finished_line(level: int, req: Any, out: Any, text: str, latency_s: float, decode) -> str:
    """The line for a finished request `req` (its scheduler Req as sent) whose last output is `out` (ReqOutput)
    with text `text`; `decode(ids) -> str` gives the input's text at levels 2 and 3."""
    parts = [f"rid={out.rid}", f"prompt_tokens={out.prompt_tokens}", f"cached_tokens={out.cached_tokens}",
             f"completion_tokens={len(out.output_ids)}", f"finish_reason={json.dumps(out.finish_reason)}",
             f"e2e_s={latency_s:.3f}"]  # fmt: skip
    if level >= 1:
        parts.append(f"sampling_params={json.dumps(_changed(req.sampling), default=str)}")
    if level >= 2:
        cut = None if level >= 3 else LOG_TEXT_CHARS
        parts.append(f"input={json.dumps(decode(req.origin_input_ids)[:cut], ensure_ascii=False)}")
        parts.append(f"output={json.dumps(text[:cut], ensure_ascii=False)}")
    return "finished " + " ".join(parts)


def _changed(sampling: Any) -> dict:
    """The sampling parameters that differ from their defaults."""
    return {f.name: getattr(sampling, f.name) for f in dataclasses.fields(sampling)
            if f.default is not dataclasses.MISSING and getattr(sampling, f.name) != f.default}  # fmt: skip
