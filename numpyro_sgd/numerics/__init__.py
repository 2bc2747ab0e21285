"""Math that sees no model and no data: dense linear algebra that never runs batched, the Langevin
diffusions' steps, step-size schedules, the theory of the frozen dynamics (OU covariances,
autocorrelation times), the gradient-noise estimators and step rules, EWSG's index chain.
"""
