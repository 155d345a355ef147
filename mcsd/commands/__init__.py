"""The command-line apps, one module each, thin: each a Hydra app (one argument style: key=value
settings on ``conf/<name>.yaml``; ``mcsd-plot``, ``mcsd-probe`` and the download take a first word,
what to draw, which probe, which corpus) that composes its config, checks it and hands the work
to the layer that does it. ``app`` is what they share (Hydra app plumbing, config resolvers,
the sweeper and launcher plugins, the bad-input rules); nothing below this package imports it.

========================  =====================  ==============================================
command                   module                 delegates to
========================  =====================  ==============================================
``mcsd-train``            :mod:`.train`          :mod:`mcsd.training` (checks, the run, its report)
``mcsd-generate``         :mod:`.generate`       :mod:`mcsd.models.decoding`
``mcsd-bench``            :mod:`.bench`          :mod:`mcsd.bench` (the grid, one point's measurements)
``mcsd-plot``             :mod:`.plot`           :mod:`mcsd.plots`
``mcsd-eval``             :mod:`.evaluate`       :mod:`mcsd.evaluation`
``mcsd-probe``            :mod:`.probe`          :mod:`mcsd.probes`
``mcsd-prepare``          :mod:`.prepare`        :mod:`mcsd.data`
``mcsd-export``           :mod:`.export`         :mod:`mcsd.hf`, :mod:`mcsd.checkpoint`
``python -m mcsd.commands.download``  :mod:`.download`  :mod:`mcsd.data.corpus`
========================  =====================  ==============================================
"""
