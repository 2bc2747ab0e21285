"""From a NumPyro model to what the samplers evaluate: the discovery trace (sites, plates), the
subsampled potential, the minibatch oracle (one device or a mesh), the pointwise
log-likelihood and the model's structure (hyperparameter sites).
"""
