"""What a study concludes: expectations, contrasts over seeds, comparisons with published
numbers and the reproduction check."""
