"""Bundled demo programs that replay real failure stories in small, on any machine, without a GPU.

``python -m hangwatch.demo.story`` replays "the story": an SGLang-style launch (tensor parallel
schedulers, target and EAGLE3 draft weights) that loads fine and then deadlocks silently in CUDA graph
capture because one rank waits in a different collective than its peers. Standard library only
(setproctitle is used when installed), so ``hangwatch run -- python -m hangwatch.demo.story`` can be
tried anywhere.
"""
