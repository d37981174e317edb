"""Real training: torch models, HDF5 speech data, the speech front end, scoring and the
distributed runtime (transports, drivers, launcher).

Imports torch, h5py and (in the transports) mpi4py; nothing in :mod:`psgdlab.core` imports this
package.
"""
