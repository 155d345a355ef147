"""Everything the project writes to disk about a model and its measurements, and reads back, in one place.

The result files of the commands that measure, each format in one module that holds its file
names, its schema, its writer and its reader (nothing else opens those files):

- :mod:`~mcsd.checkpoint.bench_results`: ``mcsd-bench``'s ``results.json`` and ``results.csv``;
- :mod:`~mcsd.checkpoint.eval_results`: ``mcsd-eval``'s ``results.json`` and ``table2.md``;
- :mod:`~mcsd.checkpoint.probe_results`: ``mcsd-probe context``'s ``context_curve.csv`` and
  ``context_delta.csv``.

A model's files, from the bottom up, each module calling only the ones before it:

- :mod:`~mcsd.checkpoint.sharded`: sharded (DCP) checkpoint folders and sharded weights (FSDP2);
- :mod:`~mcsd.checkpoint.lightning_checkpoint`: a run's Lightning checkpoints, where a run keeps
  them, read as files or sharded folders;
- :mod:`~mcsd.checkpoint.lightning_writer`: Lightning's checkpoint IO plugin, which writes them
  whole or not at all (apart, so that a reader imports no Lightning);
- :mod:`~mcsd.checkpoint.saved_model`: model folders (``model.safetensors``, ``config.json``,
  ``tokenizer.json``), exported and Hub folders, and any checkpoint, located and loaded alike;
- :mod:`~mcsd.checkpoint.run_folder`: the one reader of an ``mcsd-train`` run folder (its
  config, overrides, choices, metrics, logged config, result, latest checkpoint);
- :mod:`~mcsd.checkpoint.model_source`: a model entry (``mcsd-bench models=[...]``) resolved once:
  a registered architecture at a size, a run's config YAML or a saved model;
- :mod:`~mcsd.checkpoint.resume`: what a checkpoint remembers of its run, and resuming it.
"""
