"""Model ladders: a baseline and its variants trained at a series of sizes, a scaling law
fitted to each variant's final losses, and each variant's compute multiplier over the baseline
(`laws.py`: the laws and their fits; `fits.py`: a ladder's points, the bootstrap over seeds,
the multipliers, the held-out rung, the table; `report.py`: the plot)."""
