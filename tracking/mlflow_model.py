"""A registered Tandem model as an MLflow pyfunc model: the exported final/ directory (PEFT adapter or full weights,
and the tokenizer) as its artifact, loaded back with transformers (+ PEFT).

    model = mlflow.pyfunc.load_model("models:/tandem-tiny@champion")
    model.predict(["Hello"])                   # greedy completions with the model's chat template
    hf_model = model.unwrap_python_model().model

An adapter loads its base model from the path recorded in its adapter_config.json (the run's base model).
"""

from __future__ import annotations

import os
from typing import Any

import mlflow.pyfunc

MAX_NEW_TOKENS = 64


class TandemModel(mlflow.pyfunc.PythonModel):
    """transformers' causal LM (an adapter on its base, or full weights) with its tokenizer."""

    def load_context(self, context: Any) -> None:
        """Load the model and tokenizer from the `model` artifact (the export's directory)."""
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        path = context.artifacts["model"]
        # The precision Tandem evaluated in (trainer/evaluation/load.py): published bases are stored in bf16, which
        # transformers would otherwise keep on a CPU too, and the served model would not be the one evaluated.
        dtype = torch.bfloat16 if torch.cuda.is_available() else torch.float32
        # A model trained with model.trust_remote_code runs its own code again here (saved with it by save_pyfunc).
        remote = bool((context.model_config or {}).get("trust_remote_code", False))
        if os.path.exists(os.path.join(path, "adapter_config.json")):
            from peft import AutoPeftModelForCausalLM

            self.model = AutoPeftModelForCausalLM.from_pretrained(path, dtype=dtype, trust_remote_code=remote)
        else:
            self.model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype, trust_remote_code=remote)
        self.model.eval()
        self.tokenizer = AutoTokenizer.from_pretrained(path, trust_remote_code=remote)

    def predict(self, context: Any, model_input: list[str], params: dict[str, Any] | None = None) -> list[str]:
        """Greedy completions of user messages, rendered with the model's chat template; a model without one (trained
        on plain text) continues the text as given."""
        import torch

        out: list[str] = []
        for prompt in model_input:
            if self.tokenizer.chat_template is None:
                ids = self.tokenizer(prompt, return_tensors="pt")
            else:
                ids = self.tokenizer.apply_chat_template(
                    [{"role": "user", "content": prompt}],
                    add_generation_prompt=True,
                    return_tensors="pt",
                    return_dict=True,
                )
            with torch.no_grad():
                generated = self.model.generate(**ids, max_new_tokens=MAX_NEW_TOKENS, do_sample=False)
            out.append(str(self.tokenizer.decode(generated[0, ids["input_ids"].shape[1] :], skip_special_tokens=True)))
        return out
