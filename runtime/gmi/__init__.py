"""Trainer GMIs (GPU multiplexing instances): their placement on GPU slices, each generation's
fleet, and the data-parallel group they train in, in lockstep."""
