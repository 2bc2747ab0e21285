"""The one NumPyro ``MCMCKernel`` that runs every algorithm: tracing, init checks, warmup and
sampling programs, the SG loop, wrappers.
"""
