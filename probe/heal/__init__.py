"""Healing a pruned model: distillation from the unpruned model it was cut from (Minitron,
Muralidharan et al. 2024). `pair` checks that a teacher and a student belong together,
`distill` holds the losses, `loop` the training run that resumes after a kill."""
