-- MLflow's database beside Prefect's (docker/compose.yaml); run once, when the volume is created.
CREATE DATABASE mlflow;
