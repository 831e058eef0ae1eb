"""What the commands do below the terminal: train with tuning, run a study, export its
recommendation, plot it."""
