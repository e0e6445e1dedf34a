"""regenerate's bar: one fixed total (the user turns to answer), moved as the engine reports finished
answers (Generator.on_answer), a turn dropped because its prompt is too long counted as passed, so the
bar ends full; shown before the engine starts. A fake engine: no model runs."""

from __future__ import annotations

from draftsmith.data.regenerate import RegenSettings, regenerate
from fixtures import make_tiny_llama, write_jsonl

CONVS = [
    {"messages": [{"role": "user", "content": "first question"}, {"role": "assistant", "content": "x"},
                  {"role": "user", "content": "a follow-up whose prompt is too long"}]},
    {"messages": [{"role": "user", "content": "second"}]},
    {"messages": [{"role": "user", "content": "third"}]},
]


class Reporting:
    """Answers every prompt, reporting each as it finishes, as vLLM's request loop does."""

    name = "fake"

    def __init__(self):
        self.seen = []  # the bar's count each time an answer is reported

    def prompt_length(self, conversation):
        return 10_000 if len(conversation) > 2 else 5  # the follow-up turn (3 messages) is too long

    def generate(self, conversations, seeds):
        out = []
        for _ in conversations:
            self.on_answer(1)
            self.seen.append(self.on_answer.__self__.n)
            out.append(("an answer", 2))
        return out

    def close(self):
        pass


def test_the_bar_counts_answers_and_ends_full(tmp_path, capfd):
    target = make_tiny_llama(tmp_path / "target", num_layers=1)
    data = write_jsonl(tmp_path / "chats.jsonl", CONVS)
    gen = Reporting()
    capfd.readouterr()
    r = regenerate([str(data)], tmp_path / "out", str(target), RegenSettings(engine="hf", max_prompt_tokens=100),
                   generator=gen, progress=True, log=lambda s: None)
    assert r.manifest["counts"]["assistant_turns"] == 3  # the too-long follow-up ended its conversation
    assert gen.seen == [1, 2, 3]  # moved by each reported answer, inside the round
    frames = capfd.readouterr().err.replace("\r", "\n").split("\n")
    frames = [f.strip() for f in frames if f.strip()]
    assert all(f.startswith("regenerate:") for f in frames)
    assert any("0/4 answers" in f and "starting hf" in f for f in frames)  # before the engine is up
    assert "4/4 answers" in frames[-1] and "ETA 00:00" in frames[-1]  # 4 turns planned, 1 dropped: full
