"""One run from start to end, above the stages: ``energy.py`` (prepare -> Job, run_energy ->
EnergyRun: plan, reference, MP2, properties, result) and ``gradient.py`` (the energy run, then
the gradient stage on it). Stages (scf, mp2, grad, props) never import a driver."""
