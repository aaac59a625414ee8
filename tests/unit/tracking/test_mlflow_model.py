"""The registered model as MLflow serves it: saved as the registry mirror saves it and loaded by `mlflow.pyfunc`,
for real (a local model directory, no tracking server). Its predictions are the model's own greedy completions of
the prompt rendered the way the model was trained: through its chat template, or as plain text for a model trained
without one."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch


def greedy(model_dir: Path, ids: dict) -> str:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    with torch.no_grad():
        out = model.generate(**ids, max_new_tokens=64, do_sample=False)
    return AutoTokenizer.from_pretrained(model_dir).decode(
        out[0, ids["input_ids"].shape[1] :], skip_special_tokens=True
    )


def served(model_dir: Path, where: Path, prompts: list[str]) -> list[str]:
    import mlflow.pyfunc

    from tracking.mlflow_registry import save_pyfunc

    save_pyfunc(str(model_dir), str(where))
    return mlflow.pyfunc.load_model(str(where)).predict(prompts)


@pytest.mark.parametrize("template", [True, False], ids=["chat-template", "plain-text"])
def test_predictions_are_greedy_completions_of_the_prompt_as_trained(tiny_model, tmp_path, template) -> None:
    from transformers import AutoTokenizer

    model_dir = tmp_path / "model"
    shutil.copytree(tiny_model, model_dir)
    if not template:
        (model_dir / "chat_template.jinja").unlink()
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    assert (tokenizer.chat_template is not None) == template
    prompt = "What is the capital of France?"
    if template:
        ids = tokenizer.apply_chat_template(
            [{"role": "user", "content": prompt}], add_generation_prompt=True, return_tensors="pt", return_dict=True
        )
    else:
        ids = tokenizer(prompt, return_tensors="pt")
    expected = greedy(model_dir, ids)
    assert expected  # a random tiny model still emits tokens: an empty completion would prove nothing
    if template:  # the rendering must matter, or this case could not tell the two paths apart
        assert greedy(model_dir, tokenizer(prompt, return_tensors="pt")) != expected
    assert served(model_dir, tmp_path / "pyfunc", [prompt]) == [expected]


def test_a_model_with_its_own_code_is_served_with_the_trust_it_was_trained_with(tmp_path) -> None:
    """A remote-code model (tests/published.py per_expert_moe_scaled: auto_map and modeling file beside the weights)
    saved with trust_remote_code, as the registry mirror saves a run's with model.trust_remote_code: MLflow loads it
    with its own classes; saved without, transformers refuses to run the code."""
    import mlflow.pyfunc

    from tests.published import per_expert_moe_scaled
    from tracking.mlflow_registry import save_pyfunc

    model_dir = per_expert_moe_scaled(tmp_path / "model")
    save_pyfunc(str(model_dir), str(tmp_path / "trusted"), trust_remote_code=True)
    loaded = mlflow.pyfunc.load_model(str(tmp_path / "trusted")).unwrap_python_model()
    assert type(loaded.model).__name__ == "PerExpertMoeForCausalLM"
    save_pyfunc(str(model_dir), str(tmp_path / "untrusted"))
    with pytest.raises(ValueError, match="trust_remote_code"):
        mlflow.pyfunc.load_model(str(tmp_path / "untrusted"))
