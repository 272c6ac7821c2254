"""The verdict of the door soaks (:func:`tests.soak_support.judge`) on hand-made outcomes: failures belong to the last
kill before they ended, only retryable ones inside a kill's window are excused, and the recovery is the first answer
after the kill of the kind it affects."""

from __future__ import annotations

from tests.ops_support import LoadReport, Outcome
from tests.soak_support import Kill, judge


def _outcome(started: float, finished: float, status: str = "200", method: str = "none", retryable: bool = False,
             good: bool = True) -> Outcome:  # fmt: skip
    ok = status == "200"
    return Outcome("rest", "sentiment", method, good, ok, status, started, finished, "", retryable)


def _kills() -> list[Kill]:
    router = Kill("router", 0.0, lambda: 1, lambda outcome: True, limit_s=5.0)
    worker = Kill("pool worker", 0.0, lambda: 2, lambda outcome: outcome.method == "relevance", limit_s=5.0)
    router.killed, worker.killed = 10.0, 20.0
    return [router, worker]


def test_failures_belong_to_the_last_kill_and_recovery_is_the_first_answer_after_it() -> None:
    outcomes = [
        _outcome(1.0, 1.2),
        _outcome(9.5, 10.1, "connection", retryable=True),  # in flight at the router's kill
        _outcome(10.5, 10.6, "UNAVAILABLE", retryable=True),  # sent while it was down
        _outcome(11.0, 11.5),  # answered again: recovery 1.5 s
        _outcome(19.9, 20.2, "507", "relevance", retryable=True),  # in flight at the worker's kill
        _outcome(20.3, 20.4, "bad-4xx", good=False, retryable=False),  # a bad request misanswered: not excused
        _outcome(20.5, 21.0, method="relevance"),  # an explanation answered again: recovery 1.0 s
    ]
    figures, problems = judge(LoadReport(outcomes, 30.0), _kills())
    router, worker = figures["kills"]
    assert (router["failed"], router["failed_in_flight"], router["failed_sent_after"]) == (2, 1, 1)
    assert (worker["failed"], worker["failed_in_flight"]) == (1, 1)
    assert router["recovery_s"] == 1.5 and worker["recovery_s"] == 1.0
    assert figures["failed_good"] == 0 and figures["answered"] == 3
    assert len(problems) == 1 and "bad requests" in problems[0]


def test_a_failure_outside_the_windows_or_not_retryable_is_a_problem() -> None:
    outcomes = [
        _outcome(10.5, 11.0, "500", retryable=False),  # in the router's window, but not retryable
        _outcome(11.0, 11.5),
        _outcome(16.0, 16.2, "UNAVAILABLE", retryable=True),  # retryable, but after the router's 5 s window
        _outcome(20.5, 21.0, method="relevance"),
    ]
    figures, problems = judge(LoadReport(outcomes, 30.0), _kills())
    assert figures["failed_good"] == 2 and len(problems) == 1 and "2 good requests failed" in problems[0]


def test_a_kill_that_never_happened_or_no_recovery_is_a_problem() -> None:
    kills = _kills()
    kills[1].killed = None
    figures, problems = judge(LoadReport([_outcome(9.0, 10.5, "connection", retryable=True)], 30.0), kills)
    assert figures["kills"][0]["recovery_s"] == float("inf")
    assert any("never killed" in problem for problem in problems)
    assert any("no request it affects was answered" in problem for problem in problems)


def test_a_whole_service_kill_excuses_unanswered_requests_until_it_is_whole_again() -> None:
    service = Kill("whole service", 0.0, lambda: 1, lambda outcome: True, limit_s=600.0, wait_repair=True,
                   settle_s=2.0, unanswered_limit=float("inf"))  # fmt: skip
    service.killed, service.repaired_at = 10.0, 40.0
    outcomes = [
        _outcome(12.0, 32.0, "TIMEOUT"),  # queued while the service started again: its caller's deadline
        _outcome(39.0, 40.5),  # answered once it is whole: recovery 30.5 s
        _outcome(43.0, 43.2, "UNAVAILABLE", retryable=True),  # after the window (repaired + 2 s): a problem
    ]
    figures, problems = judge(LoadReport(outcomes, 60.0), [service], unanswered_limit=0)
    assert figures["kills"][0]["unanswered"] == 1 and figures["kills"][0]["recovery_s"] == 30.5
    assert figures["failed_good"] == 1 and len(problems) == 1 and "1 good requests failed" in problems[0]
    service.unanswered_limit = None  # the judge's limit (0) then holds for it
    assert any("got no answer" in problem for problem in judge(LoadReport(outcomes, 60.0), [service])[1])
