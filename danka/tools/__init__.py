"""User tools around training: generate/chat, eval (accuracy, pass@k), plot, export (merge
LoRA), doctor (environment report) and estimate (GPU memory plan). ``commands.py`` registers
them as ``danka`` subcommands; each is also a plain function:

- :func:`danka.tools.generate.load_for_inference`, ``generate_text``, ``generate_file``, ``chat_loop``
- :func:`danka.tools.evaluate.run_eval`, ``pass_at_k``
- :func:`danka.tools.plot.plot_run`
- :func:`danka.tools.export.export_merged`
- :func:`danka.tools.doctor.collect_checks`
- :func:`danka.planning.memory.estimate_memory` (printed by ``danka.tools.estimate``)
"""
