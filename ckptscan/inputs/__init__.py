"""A run's side inputs: the training loss log and the routing probe."""
