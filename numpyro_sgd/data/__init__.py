"""Where the rows come from: the model's arguments as the kernels see them, data read in place
(memory-mapped files, shards, ``stream``) and the native row reader.
"""
