"""The composition root: the only place that reads settings and builds storage's classes; it wires
every part (build_app, build_services) and the assemblies of the runtime, the experiments, the
tool layer and the OAuth server.
"""
