"""Choosing a variant: the user's data, the accuracy metric, and the planner that weighs fit, accuracy and speed."""
