"""Statistics that know nothing of the model: fits of a few parameters, and priors.

- :mod:`~psgdlab.core.stats.fitting`: fits of a few positive parameters with their uncertainty
  and cross-validated errors;
- :mod:`~psgdlab.core.stats.priors`: the figure a fit keeps where the data do not pin it down.

Imports nothing of core but :mod:`~psgdlab.core.errors`.
"""
