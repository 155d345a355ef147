"""Deploying a model outside training: weights in 8 or 4 bits (:mod:`mcsd.deploy.quantize`) and the
decoding step exported to ONNX with its runner (:mod:`mcsd.deploy.onnx`)."""
