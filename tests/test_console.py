"""console.engine_logs: a fake engine phase that talks the ways the real ones do (the ``vllm`` logger,
transformers' logger, a FutureWarning, raw writes to fds 1 and 2, a child process) leaves the
terminal (capfd: fds 1 and 2) with only the command's own bar and summary, and all of it in the log.
PhaseBar: a fixed total and the ETA at the phase's average rate, on a fake clock."""

from __future__ import annotations

import io
import logging
import logging.config
import os
import subprocess
import sys
import warnings

import pytest

from deadline import wait_until
from draftsmith import console

ENGINE_LINES = ["vllm-before: INFO Initializing a V1 LLM engine", "vllm-inside: WARNING max_num_batched_tokens",
                "transformers: loading weights", "FutureWarning: `torch_dtype` is deprecated", "raw fd 1 from C",
                "raw fd 2 from C", "child process stdout", "child process stderr", "plain print inside"]


@pytest.fixture
def vllm_like_logger():
    """The ``vllm`` logger as vLLM configures it at import: its own handler on sys.stdout, no
    propagation (made when called: the test's sys.stdout, not the fixture setup's)."""
    logger = logging.getLogger("vllm")

    def configure():
        logger.addHandler(logging.StreamHandler(sys.stdout))
        logger.setLevel(logging.INFO)
        logger.propagate = False
        return logger

    yield configure
    for h in list(logger.handlers):
        logger.removeHandler(h)
    logger.propagate = True
    for name in ("vllm.inside",):
        for h in list(logging.getLogger(name).handlers):
            logging.getLogger(name).removeHandler(h)


def fake_engine_phase(vllm_logger):
    """Everything an in-process engine does to a terminal."""
    vllm_logger.info("vllm-before: INFO Initializing a V1 LLM engine")
    # vLLM imported during the phase: dictConfig resolves ext://sys.stdout then
    logging.config.dictConfig({"version": 1, "disable_existing_loggers": False,
                               "handlers": {"v": {"class": "logging.StreamHandler", "stream": "ext://sys.stdout"}},
                               "loggers": {"vllm.inside": {"handlers": ["v"], "level": "INFO", "propagate": False}}})
    logging.getLogger("vllm.inside").warning("vllm-inside: WARNING max_num_batched_tokens")
    from transformers.utils import logging as hf_logging

    hf_logging.get_logger("transformers.modeling_utils").warning("transformers: loading weights")
    warnings.warn("`torch_dtype` is deprecated", FutureWarning)
    os.write(1, b"raw fd 1 from C\n")
    os.write(2, b"raw fd 2 from C\n")
    subprocess.run([sys.executable, "-c", "import sys; print('child process stdout'); "
                    "print('child process stderr', file=sys.stderr)"], check=True)
    print("plain print inside")


def test_engine_output_goes_to_the_log_and_the_terminal_keeps_bar_and_summary(tmp_path, capfd, vllm_like_logger):
    vllm_like_logger = vllm_like_logger()  # vLLM imported before the phase
    log = tmp_path / "run" / console.ENGINE_LOG
    with console.engine_logs(log) as path:
        assert path == log and console.log_path() == log
        console.say(f"engine logs: {path}")
        bar = console.PhaseBar(3, desc="regenerate", unit="conv", mininterval=0)
        for _ in range(3):
            fake_engine_phase(vllm_like_logger)
            bar.update(1)
        bar.close()
        console.say("summary: 3 conversations")
    term = capfd.readouterr()
    assert term.out == f"engine logs: {log}\nsummary: 3 conversations\n"
    bars = term.err.replace("\r", "\n").strip().splitlines()
    assert bars and all(b.startswith("regenerate:") for b in bars)  # the bar's frames, nothing else
    assert "3/3 conv" in bars[-1] and "ETA 00:00" in bars[-1]
    text = log.read_text()
    for line in ENGINE_LINES:
        assert line in text, line
    assert text.count("raw fd 1 from C") == 3
    assert "regenerate" not in text and "summary" not in text
    # afterwards everything is where it was: fds, sys streams, warnings, the handler made before
    print("after")
    os.write(2, b"after fd 2\n")
    vllm_like_logger.info("vllm after")
    term = capfd.readouterr()
    assert term.out == "after\nvllm after\n" and term.err == "after fd 2\n"
    assert "vllm after" not in log.read_text()
    # a handler made inside keeps the log (vLLM's shutdown lines stay out of the terminal)
    logging.getLogger("vllm.inside").warning("late engine line")
    assert capfd.readouterr().out == "" and "late engine line" in log.read_text()


def test_nested_engine_logs_reuse_the_open_log(tmp_path, capfd):
    with console.engine_logs(tmp_path / "a.log"):
        with console.engine_logs(tmp_path / "b.log") as inner:
            assert inner == tmp_path / "a.log"
            os.write(1, b"inner engine\n")
        os.write(1, b"outer engine\n")
    assert not (tmp_path / "b.log").exists()
    assert (tmp_path / "a.log").read_text() == "inner engine\nouter engine\n"
    assert capfd.readouterr().out == ""


def test_an_error_inside_restores_the_terminal(tmp_path, capfd):
    with pytest.raises(RuntimeError):
        with console.engine_logs(tmp_path / "e.log"):
            raise RuntimeError("engine failed")
    os.write(1, b"terminal again\n")
    assert capfd.readouterr().out == "terminal again\n" and console.log_path() is None
    assert not (tmp_path / "e.log").exists()  # refused before any engine spoke: nothing left behind
    with pytest.raises(ValueError):
        with console.engine_logs(tmp_path / "new" / "dir" / "f.log"):
            raise ValueError("bad --device")
    assert not (tmp_path / "new").exists()
    with pytest.raises(RuntimeError):
        with console.engine_logs(tmp_path / "g.log"):
            os.write(2, b"engine traceback\n")
            raise RuntimeError("engine failed")
    assert (tmp_path / "g.log").read_text() == "engine traceback\n"  # what explains the failure stays


def test_rank_log_names(monkeypatch):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    assert console.engine_log_name() == "engine.log"
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "1")
    assert console.engine_log_name() == "engine.rank1.log"
    monkeypatch.setenv("RANK", "0")
    assert console.engine_log_name() == "engine.log"


def test_phase_bar_keeps_its_total_and_spells_out_the_eta():
    clock = [100.0]
    bar = console.PhaseBar(320, desc="regenerate", unit="conv", file=io.StringIO(), clock=lambda: clock[0],
                           mininterval=0)
    assert str(bar).endswith("0/320 conv [00:00 elapsed, ETA ?]")
    # answers arrive unevenly (a round finishes in bursts): the ETA is the phase's average rate
    for dt, n in [(30.0, 10), (5.0, 70), (45.0, 0), (20.0, 80)]:
        clock[0] += dt
        bar.update(n)
        assert bar.total == 320
    # 160 of 320 in 100 s: 160 left at 1.6/s -> 100 s
    assert str(bar).endswith("160/320 conv [01:40 elapsed, ETA 01:40]")
    bar.set_postfix_str("tok_s=480")
    assert str(bar).endswith("160/320 conv [01:40 elapsed, ETA 01:40, tok_s=480]")
    clock[0] += 60.0
    bar.update(160)
    assert str(bar).endswith("320/320 conv [02:40 elapsed, ETA 00:00, tok_s=480]") and "100%" in str(bar)
    bar.close()


def test_phase_bar_resumed_counts_only_this_runs_rate():
    clock = [0.0]
    bar = console.PhaseBar(100, initial=50, unit="row", file=io.StringIO(), clock=lambda: clock[0])
    clock[0] = 10.0
    bar.update(10)  # 10 rows in 10 s this run; 40 left -> 40 s (the 50 from before are not this run's rate)
    assert str(bar).endswith("60/100 row [00:10 elapsed, ETA 00:40]")
    bar.close()


def test_phase_bar_eta_leaves_the_engine_start_out():
    clock = [0.0]
    bar = console.PhaseBar(300, unit="answers", file=io.StringIO(), clock=lambda: clock[0])
    bar.set_postfix_str("starting vllm")
    clock[0] = 60.0  # a minute to start the engine
    bar.work_started()
    clock[0] = 90.0
    bar.update(100)  # 100 answers in the 30 s since: 200 left -> 60 s, not 200 * 90 / 100
    assert str(bar).endswith("100/300 answers [01:30 elapsed, ETA 01:00, starting vllm]")
    bar.close()


def test_forwarding_counts_what_a_library_reports(capfd):
    # driven the way vllm.LLM.generate drives its use_tqdm factory: prompts rendered through it,
    # then total=, update(n) per finished request, format_dict["elapsed"], postfix, n, refresh, close
    got = []
    assert list(console.Forwarding([1, 2, 3], desc="Rendering prompts", on_update=got.append)) == [1, 2, 3]
    bar = console.Forwarding(total=3, desc="Processed prompts", dynamic_ncols=True, postfix="est. speed",
                             on_update=got.append)
    bar.update(1)
    assert bar.format_dict["elapsed"] >= 0
    bar.postfix = "est. speed input: 1.00 toks/s"
    bar.update(2)
    assert bar.n == 3 and got == [1, 2]
    bar.refresh()
    bar.close()
    assert capfd.readouterr() == ("", "")  # drawn nowhere


def test_ticking_redraws_while_an_engine_starts():
    clock = [0.0]
    out = io.StringIO()
    bar = console.PhaseBar(10, unit="answers", file=out, clock=lambda: clock[0])
    drawn = out.getvalue().count("\r")
    with bar.ticking(every=0.01):
        for t in range(1, 6):
            clock[0] = float(t)
            # the ticker thread redraws on its own (nothing here calls refresh): wait for its frame
            wait_until(lambda: f"[00:0{t} elapsed" in out.getvalue().rsplit("\r", 1)[1], what=f"a redraw at {t} s")
    assert out.getvalue().count("\r") > drawn and "[00:05 elapsed" in out.getvalue().rsplit("\r", 1)[1]
    bar.close()


def test_an_engine_handler_holding_an_older_stream_is_moved_too(tmp_path):
    # transformers makes its handler on its first log line with the sys.stderr of that moment, which under a
    # test runner (or any wrapper) may be a stream that is neither the terminal nor today's sys.stderr
    import io

    older = io.StringIO()
    handler = logging.StreamHandler(older)
    logger = logging.getLogger("transformers.fake_engine")
    logger.addHandler(handler)
    try:
        with console.engine_logs(tmp_path / console.ENGINE_LOG) as path:
            logger.warning("loading weights")
        assert handler.stream is older and older.getvalue() == ""  # put back after, written to the log during
        assert "loading weights" in path.read_text()
    finally:
        logger.removeHandler(handler)
