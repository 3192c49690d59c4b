"""Entry points that are not the training job's ranks: run by a backend like any job (`mode=eval`)."""
