from __future__ import annotations

from app.experiments.evidence.compare import ExperimentEvidence, recommend


def ev(eid: str, **fields: object) -> ExperimentEvidence:
    return ExperimentEvidence(experiment_id=eid, name=eid, state="COMPLETED", **fields)  # type: ignore[arg-type]


def test_fewest_failures_wins_and_says_why() -> None:
    best, reason = recommend(
        [
            ev("round", tests_total=10, tests_failed=1, last_exit_code=1, lines_changed=2),
            ev("decimal", tests_total=10, tests_failed=0, last_exit_code=0, lines_changed=30),
            ev("trunc", tests_total=10, tests_failed=2, last_exit_code=1, lines_changed=1),
        ]
    )
    assert best == "decimal"
    assert "fewest failing tests (0 of 10" in reason


def test_then_clean_exit_then_smallest_change_then_fastest() -> None:
    assert (
        recommend(
            [
                ev("a", tests_total=3, tests_failed=0, last_exit_code=1),
                ev("b", tests_total=3, tests_failed=0, last_exit_code=0),
            ]
        )[0]
        == "b"
    )
    assert (
        recommend(
            [
                ev("a", tests_total=3, tests_failed=0, last_exit_code=0, lines_changed=9),
                ev("b", tests_total=3, tests_failed=0, last_exit_code=0, lines_changed=4),
            ]
        )[0]
        == "b"
    )
    best, reason = recommend(
        [
            ev("a", tests_total=3, tests_failed=0, last_exit_code=0, lines_changed=4, duration_s=9),
            ev("b", tests_total=3, tests_failed=0, last_exit_code=0, lines_changed=4, duration_s=2),
        ]
    )
    assert best == "b"
    assert "fastest" in reason


def test_no_recommendation_without_evidence_or_on_a_tie() -> None:
    assert recommend([ev("a"), ev("b")])[0] is None
    assert recommend([ev("a")])[0] is None
    tie = [ev(x, tests_total=1, tests_failed=0, last_exit_code=0, lines_changed=1) for x in "ab"]
    best, reason = recommend(tie)
    assert best is None
    assert "tie" in reason


def test_tested_experiments_beat_untested_ones() -> None:
    assert (
        recommend(
            [
                ev("untested", last_exit_code=0),
                ev("tested", tests_total=5, tests_failed=1, last_exit_code=1),
            ]
        )[0]
        == "tested"
    )


def test_the_reason_names_experiments_by_their_labels() -> None:
    best, reason = recommend(
        [
            ev("exp_1", label="Decimal fix", tests_total=6, tests_failed=0, last_exit_code=0),
            ev("exp_2", label="Rounding fix", tests_total=6, tests_failed=1, last_exit_code=1),
        ]
    )
    assert best == "exp_1"
    assert reason.startswith("Decimal fix: fewest failing tests (0 of 6, against 1 for Rounding")
