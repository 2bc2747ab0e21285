"""The samplers, one file per paper's algorithm, and the Langevin steps they share.
"""
