"""The performance model: a point's epoch time and peak memory per rank, predicted before it runs.

`profile` times the network layer by layer on this machine's device (cached per network, data shape,
batch, dtype, device); `links` prices collectives and sends from a calibration record; `costs` has the
pieces every strategy's step is made of (compute, ring collectives, sends, overlap, bubble); `step` composes
them per strategy family from the point's `Layout`; `memory` adds up what one rank holds; `predictor` turns
points into predictions, and `recommend` ranks a cell's strategies by them.
"""
