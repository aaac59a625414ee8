"""The pipeline's plain functions, free of Prefect, that the tasks in tasks/ wrap: planning a run (`plan.py`: its id and
its spec), the base model (`models.py`), the registration gate (`gate.py`), what a registry entry records
(`lineage.py`), the model card (`model_card.py`) and the loss curve (`loss_curve.py`)."""
