"""The server process, its model: the global model's versions (``global_model``, kept by ``version_store``) and
the methods' strategies that make the next one (``strategy``, ``buffered_mean``, ``fedrevive_strategy``)."""
