"""Evaluation: real benchmark tasks (``verispec.eval.tasks``) and a sandbox for model-written code
(``verispec.eval.sandbox``). Importing this package imports nothing heavy."""
