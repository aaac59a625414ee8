"""Online RL's prompts (staging/prompts.py): GSM8K's, OpenR1-Math's and TRL's layouts recognised; each prompt staged as
its chat template's rendering with the generation prompt, no target, and its record (location, prompt messages, every
other column); a record without its reference answer refused in one line naming it (or left out with
data.on_invalid=skip) when data.require_answer; a prompt over data.max_length cut from the left or dropped; a record of
another kind refused."""

from __future__ import annotations

from pathlib import Path

import pytest

from config.sections.run_data import DataConfig
from core.errors import UserError
from staging.prompts import encode_prompts, normalize
from staging.stage import stage_dataset
from staging.tokenize import EncoderSettings
from staging.tokenizer import load_tokenizer
from storage.location import Location
from storage.shards import IGNORE_INDEX
from storage.split_reader import Shard, Split
from tests.datafiles import write_jsonl

GSM8K = {"question": "Natalia sold 48 clips. How many?", "answer": "She sold 48.\n#### 48"}
OPENR1 = {"problem": "Find $x$ if $2x=6$.", "solution": "So $x=\\boxed{3}$.", "answer": "3", "source": "olympiad"}
TRL = {
    "prompt": [{"role": "system", "content": "Think first."}, {"role": "user", "content": "1+1?"}],
    "solution": "2",
    "level": 1,
}


def stage(tmp_path: Path, tiny_model: str, records: list[dict], **data: object) -> Split:
    tmp_path.mkdir(parents=True, exist_ok=True)
    source = write_jsonl(tmp_path / "prompts.jsonl", records)
    cfg = DataConfig.model_validate({"source": str(source), "preference": "prompts", "eval_ratio": 0, **data})
    ref = stage_dataset(cfg, Location(str(tmp_path / "storage")), tiny_model)
    return Split([Shard(p) for p in sorted((Path(ref.url) / "train").glob("*.arrow"))], len(records))


def test_each_layout_is_staged_as_its_rendered_prompt_and_its_record(tmp_path: Path, tiny_model: str) -> None:
    rows = stage(tmp_path, tiny_model, [GSM8K, OPENR1, TRL], require_answer=True)
    tokenizer = load_tokenizer(tiny_model)
    assert rows.prompts and len(rows) == 3
    for index, (messages, columns) in enumerate(
        [
            ([{"role": "user", "content": GSM8K["question"]}], {"answer": GSM8K["answer"]}),
            ([{"role": "user", "content": OPENR1["problem"]}], {k: v for k, v in OPENR1.items() if k != "problem"}),
            (TRL["prompt"], {"solution": "2", "level": 1}),
        ]
    ):
        row, record = rows[index], rows.record(index)
        expected = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        assert tokenizer.decode(row.input_ids) == expected and expected.endswith("<|im_start|>assistant\n")
        assert set(row.labels) == {IGNORE_INDEX}
        assert record == {"location": f"{tmp_path / 'prompts.jsonl'}:{index + 1}", "prompt": messages,
                          "columns": columns}  # fmt: skip


def test_a_record_without_its_reference_answer_is_one_line_naming_it(tmp_path: Path, tiny_model: str) -> None:
    unanswered = {"question": "What is 2+2?"}
    with pytest.raises(UserError) as info:
        stage(tmp_path, tiny_model, [GSM8K, unanswered], require_answer=True)
    message = str(info.value)
    assert message.startswith(f"{tmp_path / 'prompts.jsonl'}:2: no reference answer ('answer' or 'solution')")
    assert "\n" not in message and info.value.exit_code == 2
    assert len(stage(tmp_path / "skip", tiny_model, [GSM8K, unanswered], require_answer=True, on_invalid="skip")) == 1


def test_a_long_prompt_keeps_its_end_or_is_dropped(tmp_path: Path, tiny_model: str) -> None:
    encoder = EncoderSettings(tiny_model, max_length=12).encoder()
    items = [("f:1", normalize("f:1", GSM8K, False)), ("f:2", normalize("f:2", {"question": "Hi"}, False))]
    whole = encode_prompts(EncoderSettings(tiny_model, max_length=4096).encoder(), items)
    cut = encode_prompts(encoder, items)
    assert cut.lengths.tolist() == [12, 12] and cut.truncated.tolist() == [True, True]
    assert cut.ids[:12].tolist() == whole.ids[whole.lengths[0] - 12 : whole.lengths[0]].tolist()
    dropped = encode_prompts(EncoderSettings(tiny_model, max_length=12, excess_length="drop").encoder(), items)
    assert len(dropped.kept) == 0 and [index for index, _ in dropped.dropped] == [0, 1]
    assert "prompt tokens, longer than data.max_length=12" in dropped.dropped[0][1]


def test_a_record_of_another_kind_is_refused(tmp_path: Path, tiny_model: str) -> None:
    with pytest.raises(UserError, match="its first records are not a prompt record \\(keys \\['messages'\\]\\)"):
        stage(tmp_path, tiny_model, [{"messages": [{"role": "user", "content": "hi"}]}])
    with pytest.raises(UserError, match="the last message is the assistant's"):
        stage(tmp_path / "b", tiny_model, [{"prompt": [{"role": "assistant", "content": "hi"}], "answer": "1"}])
