"""Rollouts: the engine's state machine, the stage sender, stage order, and the reconciler that keeps each group's
devices on the group's desired release."""
