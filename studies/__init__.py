"""calibrl's studies: each study's runs, analysis and data paths, and the rebuild of docs/results/ from the
committed data (``python -m studies.reproduce [--check]``). Not part of the installed package (the wheel ships
``calibrl`` only); run them from the repository root as ``python -m studies.<name>``.

Each module is one study (its command, its analysis, its report), e.g. ``testbed`` (the testbed study, with
``testbed_study``), ``protocol`` (the pre-registered scratchpad study, with ``protocol_analysis``),
``realmodel_study`` and ``realmodel_powered`` (the real-model studies), ``reproduce`` (every study's rebuild).
Cost benchmarks, which print a measured figure and keep no results, stay in ``bench/``.
"""
