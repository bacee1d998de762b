"""Fix 18 of ``common/nvflare_private.py``: the ERROR NVFlare logs for a leaf's sync that reached the server
before its runner was built stays in NVFlare's log files and off the console."""


def test_a_leafs_early_sync_error_leaves_the_console_and_stays_in_the_log_files(tmp_path):
    """Fix 18: NVFlare's own aux runner, asked for ``__sync_runner__`` before a server runner registered it, answers
    TOPIC_UNKNOWN (the leaf retries) and logs an ERROR; the run's log config filters exactly that line from the
    console handler and from no file handler, and an unknown topic of any other name still reaches the console."""
    import json
    import logging

    from nvflare.apis.fl_constant import ReservedTopic
    from nvflare.apis.fl_context import FLContext
    from nvflare.apis.shareable import ReturnCode, Shareable
    from nvflare.private.aux_runner import AuxRunner

    from common.nvflare_private import EarlySyncNotice
    from jobs.run.environments import EARLY_SYNC_NOTICE, quiet_log_config

    config = json.loads(open(quiet_log_config(str(tmp_path))).read())
    filters = {name: h.get("filters", []) for name, h in config["handlers"].items()}
    assert "edgesimEarlySync" in filters["consoleHandler"]
    assert all("edgesimEarlySync" not in f for name, f in filters.items() if name != "consoleHandler")
    assert config["filters"]["edgesimEarlySync"] == {"()": EARLY_SYNC_NOTICE}

    class Lines(logging.Handler):
        def __init__(self) -> None:
            super().__init__()
            self.lines: list[str] = []

        def emit(self, record: logging.LogRecord) -> None:
            self.lines.append(record.getMessage())

    runner = AuxRunner(engine=None)
    console, log_file = Lines(), Lines()
    console.addFilter(EarlySyncNotice())
    for handler in (console, log_file):
        runner.logger.addHandler(handler)
    try:
        reply = runner._process_request(ReservedTopic.SYNC_RUNNER, Shareable(), FLContext())
        assert reply.get_return_code() == ReturnCode.TOPIC_UNKNOWN  # the leaf's cue to retry
        runner._process_request("some_other_topic", Shareable(), FLContext())
    finally:
        for handler in (console, log_file):
            runner.logger.removeHandler(handler)
    assert any("unknown aux message topic __sync_runner__" in line for line in log_file.lines), log_file.lines
    assert not any("__sync_runner__" in line for line in console.lines), console.lines
    assert any("unknown aux message topic some_other_topic" in line for line in console.lines), console.lines
