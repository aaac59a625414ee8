"""Evaluation: the evaluate stage, the model it loads, generated answers and their scores, benchmark tasks, samples."""
