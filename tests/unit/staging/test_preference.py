"""Preference data as users have it (LLaMA-Factory's ShareGPT, OpenAI-style, alpaca and v1 pairs, TRL's pairs, KTO
feedback, dataset_info.json entries with `ranking` or `kto_tag`): recognised and refused in one line by default, and
with data.preference=chosen staged as its desirable side only: a rejected answer, or an answer labelled false, is
never in a staged row, and records labelled false are listed and counted."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pytest

from config.sections.run_data import DataConfig
from core.errors import UserError
from staging.formats import DETECT_SAMPLE
from staging.stage import stage_dataset
from storage.location import Location
from storage.manifest import read_manifest
from storage.shards import IGNORE_INDEX
from tests.datafiles import qwen, read_records, write_json, write_jsonl

Q, C, R = "Is the sky blue?", "Yes, on a clear day.", "No, it is plaid."
EXPECTED = {"messages": [{"role": "user", "content": Q}, {"role": "assistant", "content": C}]}


def parts(text: str) -> list[dict[str, str]]:
    return [{"type": "text", "value": text}]


# One preference record in each form, with its form's name and the columns the refusal names.
PAIRS = {
    "sharegpt": (
        {
            "conversations": [{"from": "human", "value": Q}],
            "chosen": {"from": "gpt", "value": C},
            "rejected": {"from": "gpt", "value": R},
        },
        "LLaMA-Factory's ShareGPT pairs: columns 'chosen', 'rejected'",
    ),
    "openai": (
        {
            "messages": [{"role": "user", "content": Q}],
            "chosen": {"role": "assistant", "content": C},
            "rejected": {"role": "assistant", "content": R},
        },
        "LLaMA-Factory's OpenAI-style pairs: columns 'chosen', 'rejected'",
    ),
    "alpaca": (
        {"instruction": Q, "input": "", "chosen": C, "rejected": R},
        "LLaMA-Factory's alpaca pairs: columns 'chosen', 'rejected'",
    ),
    "v1": (
        {
            "chosen_messages": [{"role": "user", "content": parts(Q)}, {"role": "assistant", "content": parts(C)}],
            "rejected_messages": [{"role": "user", "content": parts(Q)}, {"role": "assistant", "content": parts(R)}],
        },
        "LLaMA-Factory v1's pairs: columns 'chosen_messages', 'rejected_messages'",
    ),
    "trl": ({"prompt": Q, "chosen": C, "rejected": R}, "TRL's preference pairs: columns 'chosen', 'rejected'"),
    "trl conversational": (
        {
            "prompt": [{"role": "user", "content": Q}],
            "chosen": [{"role": "assistant", "content": C}],
            "rejected": [{"role": "assistant", "content": R}],
        },
        "TRL's preference pairs: columns 'chosen', 'rejected'",
    ),
    "trl implicit prompt": (
        {
            "chosen": [{"role": "user", "content": Q}, {"role": "assistant", "content": C}],
            "rejected": [{"role": "user", "content": Q}, {"role": "assistant", "content": R}],
        },
        "TRL's preference pairs: columns 'chosen', 'rejected'",
    ),
}
FEEDBACK = {
    "openai": (
        {"messages": [{"role": "user", "content": Q}, {"role": "assistant", "content": C}], "label": True},
        "KTO feedback on OpenAI messages: column 'label'",
    ),
    "sharegpt": (
        {"conversations": [{"from": "human", "value": Q}, {"from": "gpt", "value": C}], "label": True},
        "KTO feedback on ShareGPT conversations: column 'label'",
    ),
    "alpaca": ({"instruction": Q, "output": C, "kto_tag": True}, "KTO feedback on alpaca records: column 'kto_tag'"),
    "trl": ({"prompt": Q, "completion": C, "label": True}, "TRL's unpaired KTO feedback: column 'label'"),
}
PAIR_FIXES = (
    "which supervised fine-tuning would mistrain: it has no place for the rejected answers; set "
    "data.preference=chosen to train on the prompts and chosen answers only (rejected answers are never targets), or "
    "train it with a preference objective (train.objective=dpo, ipo or orpo, which stages its pairs)"
)
FEEDBACK_FIXES = (
    "which supervised fine-tuning would mistrain: it would imitate the answers labelled false; set "
    "data.preference=chosen to train on the records labelled true only (those labelled false are left out and listed "
    "in rejects.jsonl), or train it with a preference objective (train.objective=kto, which stages its labelled "
    "answers)"
)
CASES = [(f"{name} pairs", record, form, PAIR_FIXES) for name, (record, form) in PAIRS.items()] + [
    (f"{name} feedback", record, form, FEEDBACK_FIXES) for name, (record, form) in FEEDBACK.items()
]


@pytest.mark.parametrize(("case", "record", "form", "fixes"), CASES, ids=[case[0] for case in CASES])
def test_every_form_is_refused_by_default_in_one_line(tmp_path, case, record, form, fixes) -> None:
    path = write_jsonl(tmp_path / "d.jsonl", [record] * 2)
    with pytest.raises(UserError) as info:
        read_records(path, "auto")
    assert str(info.value) == f"{path}: preference data ({form}), {fixes}"


@pytest.mark.parametrize(("case", "record", "form", "fixes"), CASES, ids=[case[0] for case in CASES])
def test_with_chosen_every_form_gives_the_prompt_and_the_desirable_answer(tmp_path, case, record, form, fixes) -> None:
    path = write_json(tmp_path / "d.json", [record])
    [got] = read_records(path, "auto", preference="chosen")
    assert got.conversation == EXPECTED


def test_a_preference_record_past_the_first_records_is_not_trained_either(tmp_path) -> None:
    # The file looks supervised in the records its format is told from; the pair comes after them.
    record, _ = PAIRS["sharegpt"]
    path = write_jsonl(tmp_path / "d.jsonl", [qwen(("user", "hi"), ("assistant", "hello"))] * DETECT_SAMPLE + [record])
    with pytest.raises(UserError) as info:
        read_records(path, "auto")
    assert str(info.value) == (
        f"{path}:{DETECT_SAMPLE + 1}: preference data (LLaMA-Factory's ShareGPT pairs: columns 'chosen', "
        f"'rejected'), {PAIR_FIXES} (or set data.on_invalid=skip to skip invalid records)"
    )


def test_a_boolean_label_beside_plain_text_is_not_kto_feedback(tmp_path) -> None:
    # A classifier's data ({"text", "label"}) read as text: KTO labels answers, and plain text has none.
    path = write_jsonl(tmp_path / "d.jsonl", [{"text": "A fine film.", "label": True}])
    assert [r.conversation for r in read_records(path, "auto")] == [{"text": "A fine film."}]


def test_renamed_columns_are_named_as_the_user_named_them(tmp_path) -> None:
    from staging.mapping import Mapping

    mapping = Mapping("sharegpt", {"messages": "dialog", "chosen": "better", "rejected": "worse"})
    good = {
        "dialog": [{"from": "human", "value": Q}],
        "better": {"from": "gpt", "value": C},
        "worse": {"from": "gpt", "value": R},
    }
    path = write_jsonl(tmp_path / "d.jsonl", [good, {**good, "better": {"from": "gpt", "value": ""}}])
    with pytest.raises(UserError) as info:
        read_records(path, "sharegpt", mapping)
    assert str(info.value).startswith(
        f"{path}: preference data (LLaMA-Factory's ShareGPT pairs: columns 'better', 'worse'), "
    )
    with pytest.raises(UserError) as info:
        read_records(path, "sharegpt", mapping, preference="chosen")
    assert str(info.value).startswith(f"{path}:2: better.value (column chosen): empty text ")


SHAREGPT, OPENAI, V1, TRL = (PAIRS[name][0] for name in ("sharegpt", "openai", "v1", "trl"))
KTO_ALPACA = FEEDBACK["alpaca"][0]


@pytest.mark.parametrize(
    ("first", "record", "reason"),
    [
        (SHAREGPT, {**SHAREGPT, "rejected": None}, "rejected: expected a string, a turn or a list of turns, got null"),
        (
            SHAREGPT,
            {k: v for k, v in SHAREGPT.items() if k != "rejected"},
            "'rejected': missing; a pair needs a 'chosen' and a 'rejected' answer",
        ),
        (
            SHAREGPT,
            {**SHAREGPT, "rejected": SHAREGPT["chosen"]},
            "'chosen' and 'rejected' are the same answer; a pair needs two different ones",
        ),
        (SHAREGPT, {**SHAREGPT, "chosen": {"from": "gpt", "value": " "}}, "chosen.value: empty text"),
        (
            SHAREGPT,
            {**SHAREGPT, "conversations": [{"from": "human", "value": Q}, {"from": "gpt", "value": C}]},
            "chosen: roles out of order: turn 2 is 'assistant', expected 'user' or 'tool'",
        ),
        (
            OPENAI,
            {**OPENAI, "chosen": {"role": "user", "content": C}},
            "chosen: an answer is the assistant's, got a 'user' turn",
        ),
        (
            V1,
            {
                "chosen_messages": [{"role": "user", "content": Q}, {"role": "assistant", "content": C}],
                "rejected_messages": [{"role": "user", "content": "Why?"}, {"role": "assistant", "content": R}],
            },
            "'chosen_messages' and 'rejected_messages' share no prompt; a pair is two answers to one prompt",
        ),
        (
            TRL,
            {"chosen": C, "rejected": R},
            "'chosen' and 'rejected' are texts without a 'prompt' (TRL's implicit-prompt text form), which Tandem "
            "does not read; add the 'prompt', or give both as conversations",
        ),
        (
            FEEDBACK["openai"][0],
            {"messages": FEEDBACK["openai"][0]["messages"]},
            "'label': missing; KTO feedback labels every record true or false",
        ),
        (
            KTO_ALPACA,
            {**KTO_ALPACA, "kto_tag": "yes"},
            "kto_tag: expected true or false (a desirable answer or not), got 'yes'",
        ),
    ],
)
def test_invalid_preference_records_name_the_line_and_the_reason(tmp_path, first, record, reason) -> None:
    path = write_jsonl(tmp_path / "d.jsonl", [first, record])  # the first record tells the file's form
    with pytest.raises(UserError) as info:
        read_records(path, "auto", preference="chosen")
    assert str(info.value) == f"{path}:2: {reason} (or set data.on_invalid=skip to skip invalid records)"


def write_catalog(folder: Path, n: int) -> Path:
    """LLaMA-Factory's demo entries as its dataset_info.json declares them, over files of n records written here: a
    ShareGPT DPO set (`ranking: true`), an OpenAI-messages KTO set (`kto_tag` column) labelled true and false in
    turn, and its plain-text set (`wiki_demo.txt`)."""
    folder.mkdir()
    dpo = [
        {
            "conversations": [{"from": "human", "value": f"What is {i} plus {i}?"}],
            "chosen": {"from": "gpt", "value": f"{2 * i}."},
            "rejected": {"from": "gpt", "value": f"A secret, {i}."},
        }
        for i in range(n)
    ]
    kto = [
        {
            "messages": [
                {"role": "user", "content": f"What is {i} times 2?"},
                {"role": "assistant", "content": f"{2 * i}." if i % 2 == 0 else f"Plaid {i}."},
            ],
            "label": i % 2 == 0,
        }
        for i in range(n)
    ]
    write_json(folder / "dpo_en_demo.json", dpo)
    write_json(folder / "kto_en_demo.json", kto)
    (folder / "wiki_demo.txt").write_text("".join(f"Line {i} of the wiki.\n\n" for i in range(n)))
    chat_tags = {"role_tag": "role", "content_tag": "content", "user_tag": "user", "assistant_tag": "assistant"}
    catalog = {
        "dpo_en_demo": {
            "file_name": "dpo_en_demo.json",
            "ranking": True,
            "formatting": "sharegpt",
            "columns": {"messages": "conversations", "chosen": "chosen", "rejected": "rejected"},
        },
        "kto_en_demo": {
            "file_name": "kto_en_demo.json",
            "formatting": "sharegpt",
            "columns": {"messages": "messages", "kto_tag": "label"},
            "tags": chat_tags,
        },
        "wiki_demo": {"file_name": "wiki_demo.txt", "columns": {"prompt": "text"}},
    }
    (folder / "dataset_info.json").write_text(json.dumps(catalog))
    return folder / "dataset_info.json"


def stage(source: str, storage: Path, tokenizer: str, **settings: object):
    return stage_dataset(
        DataConfig(source=source, max_length=128, eval_ratio=0, **settings),
        Location(str(storage)),
        tokenizer,
        bars=False,
    )


def staged_rows(url: str, tokenizer: str) -> list[tuple[str, list[str]]]:
    """(the whole text, the target runs) of every staged row, decoded."""
    from staging.tokenizer import load_tokenizer

    tok = load_tokenizer(tokenizer)
    table = pa.ipc.open_file(Path(url) / "train" / "shard-00000.arrow").read_all()
    out = []
    for ids, labels in zip(table.column("input_ids").to_pylist(), table.column("labels").to_pylist(), strict=True):
        runs, current = [], []
        for token, label in [*zip(ids, labels, strict=True), (0, IGNORE_INDEX)]:
            if label != IGNORE_INDEX:
                current.append(token)
            elif current:
                runs.append(tok.decode(current))
                current = []
        out.append((tok.decode(ids), runs))
    return out


def test_a_dpo_entry_trains_the_chosen_answers_and_never_a_rejected_one(tmp_path, tiny_model) -> None:
    catalog = write_catalog(tmp_path / "lf", 8)
    dpo = tmp_path / "lf" / "dpo_en_demo.json"
    with pytest.raises(UserError) as info:
        stage(f"{catalog}#dpo_en_demo", tmp_path / "s", tiny_model)
    assert str(info.value) == (
        f"{dpo}: preference data (LLaMA-Factory's ShareGPT pairs: columns 'chosen', 'rejected'), {PAIR_FIXES}"
    )
    assert not list((tmp_path / "s").glob("datasets/ds-*"))
    ref = stage(f"{catalog}#dpo_en_demo", tmp_path / "s", tiny_model, preference="chosen")
    manifest, _ = read_manifest(Location(ref.url), "tandem.dataset/1")
    assert manifest["records"] == {"read": 8, "staged": 8, "rejected": 0, "dropped": 0, "undesirable": 0}
    [source] = manifest["sources"]
    assert (source["format"], source["preference"], source["records"]) == ("sharegpt", "sharegpt pairs", 8)
    rows = staged_rows(ref.url, tiny_model)
    assert sorted(runs[0] for _, runs in rows) == sorted(f"{2 * i}.<|im_end|>\n" for i in range(8))
    assert all(len(runs) == 1 and "secret" not in text for text, runs in rows)


def test_a_kto_entry_trains_what_is_labelled_true_and_lists_the_rest(tmp_path, tiny_model) -> None:
    from flows.prepare import summary_rows

    catalog = write_catalog(tmp_path / "lf", 8)
    kto = tmp_path / "lf" / "kto_en_demo.json"
    with pytest.raises(UserError) as info:
        stage(f"{catalog}#kto_en_demo", tmp_path / "s", tiny_model)
    assert str(info.value) == (
        f"{kto}: preference data (KTO feedback on ShareGPT conversations: column 'label'), {FEEDBACK_FIXES}"
    )
    # data.on_invalid=fail (the default) does not stop on them: they are not invalid.
    ref = stage(f"{catalog}#kto_en_demo", tmp_path / "s", tiny_model, preference="chosen")
    manifest, _ = read_manifest(Location(ref.url), "tandem.dataset/1")
    assert manifest["records"] == {"read": 8, "staged": 4, "rejected": 0, "dropped": 0, "undesirable": 4}
    assert manifest["sources"][0]["undesirable"] == 4 and manifest["mix"]["sources"][0]["undesirable"] == 4
    rejects = [json.loads(line) for line in (Path(ref.url) / "rejects.jsonl").read_text().splitlines()]
    assert rejects == [
        {
            "location": f"{kto}[{i}]",
            "reason": "labelled undesirable (label: false): left out by data.preference=chosen, never a target",
        }
        for i in (1, 3, 5, 7)
    ]
    rows = staged_rows(ref.url, tiny_model)
    assert sorted(runs[0] for _, runs in rows) == sorted(f"{2 * i}.<|im_end|>\n" for i in (0, 2, 4, 6))
    assert not any("Plaid" in text for text, _ in rows)
    records = dict(summary_rows(ref, Location(str(tmp_path / "s"))))["records"]
    assert records == f"8 read, 4 staged, 0 rejected, 0 dropped, 4 undesirable (see {Path(ref.url) / 'rejects.jsonl'})"


def test_the_text_entry_reads_one_example_a_line(tmp_path, tiny_model) -> None:
    catalog = write_catalog(tmp_path / "lf", 8)
    ref = stage(f"{catalog}#wiki_demo", tmp_path / "s", tiny_model)
    manifest, _ = read_manifest(Location(ref.url), "tandem.dataset/1")
    assert manifest["records"]["read"] == manifest["records"]["staged"] == 8  # the blank lines are no examples
    assert (manifest["sources"][0]["format"], manifest["packing"]) == ("text", True)
    [(text, runs)] = staged_rows(ref.url, tiny_model)  # packed into one row, every token a target
    assert runs == [text]
    assert sorted(text.split("<|endoftext|>")) == ["", *sorted(f"Line {i} of the wiki." for i in range(8))]
