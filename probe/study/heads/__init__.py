"""Head studies of a real model: one imported model, its heads measured by cached steps, a
report and verdicts against papers."""
