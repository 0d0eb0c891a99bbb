"""Tests for posttrain/testing/rules/margins.py and the margins evaluate_rule reports."""

from __future__ import annotations

import math

import pytest

from posttrain.testing.rules.interpreter import evaluate_rule
from posttrain.testing.rules.margins import Link, Margin, binding_margin, is_thin, link_margin

DATA = {"train/clip_fraction": {"1": 0.1, "2": 0.27}, "train/entropy": {"1": 0.5, "2": 0.4}}


class TestLinkMargin:
    @pytest.mark.parametrize(
        ("link", "expected"),
        [
            (Link(0.27, "<", 0.3), 0.1),  # (0.3 - 0.27) / 0.3
            (Link(0.27, "<=", 0.3), 0.1),
            (Link(0.44, ">", 0.4), 0.1),  # (0.44 - 0.4) / 0.4
            (Link(0.44, ">=", 0.4), 0.1),
            (Link(0.5, "<", 0.4), -0.25),  # failing: negative
            (Link(-0.45, ">", -0.5), 0.1),  # relative to |bound|
        ],
    )
    def test_relative_to_the_bound(self, link, expected):
        margin = link_margin(link)
        assert margin is not None
        assert margin.margin == pytest.approx(expected)
        assert (margin.value, margin.bound) == (link.left, link.right)

    def test_bound_on_the_left(self):
        margin = link_margin(Link(0.05, "<", 0.06, bound_on_left=True))
        assert margin == Margin(0.06, 0.05, pytest.approx(0.2))

    def test_zero_bound_has_no_relative_margin(self):
        assert link_margin(Link(1.19, ">", 0)) == Margin(1.19, 0, None)

    @pytest.mark.parametrize(
        "link",
        [Link(1.0, "==", 1.0), Link(1.0, "!=", 2.0), Link("3", "in", {"3": 1}), Link(True, "<", 2), Link(1, "<", "x")],
    )
    def test_no_margin_for_equality_membership_or_non_numbers(self, link):
        assert link_margin(link) is None

    def test_non_finite_side_has_no_margin(self):
        assert link_margin(Link(math.inf, "<", 1.0)) is None


class TestBindingMargin:
    def test_tightest_link_of_a_chain(self):
        links = [Link(0.5, "<", 0.7, bound_on_left=True), Link(0.7, "<", 0.8)]
        margin = binding_margin(links)
        assert margin == Margin(0.7, 0.8, pytest.approx(0.125))

    def test_scaled_margin_preferred_over_a_zero_bound(self):
        links = [Link(0, "<", 0.7, bound_on_left=True), Link(0.7, "<", 0.8)]
        assert binding_margin(links) == Margin(0.7, 0.8, pytest.approx(0.125))

    def test_none_without_order_links(self):
        assert binding_margin([Link(1, "==", 1)]) is None
        assert binding_margin([]) is None


class TestIsThin:
    @pytest.mark.parametrize(
        ("margin", "min_margin", "thin"),
        [(0.04, 0.05, True), (0.0, 0.05, True), (0.05, 0.05, False), (0.5, 0.05, False), (-0.1, 0.05, False)],
    )
    def test_threshold(self, margin, min_margin, thin):
        assert is_thin(Margin(1.0, 1.0, margin), min_margin) is thin

    def test_no_margin_is_never_thin(self):
        assert not is_thin(None, 0.05)
        assert not is_thin(Margin(1.0, 0, None), 0.05)

    def test_disabled_at_zero(self):
        assert not is_thin(Margin(1.0, 1.0, 0.0), 0.0)


class TestMarginsInResults:
    def test_value_bound_margin_of_a_comparison(self):
        result = evaluate_rule(DATA, 'max(data["train/clip_fraction"]) < 0.3')
        assert (result.value, result.bound) == (0.27, 0.3)
        assert result.margin == pytest.approx(0.1)

    def test_bound_is_the_side_that_reads_no_metric(self):
        result = evaluate_rule(DATA, '0.3 > max(data["train/clip_fraction"])')
        assert (result.value, result.bound) == (0.27, 0.3)
        assert result.margin == pytest.approx(0.1)

    def test_chained_comparison_reports_the_tightest_link(self):
        result = evaluate_rule(DATA, '0.1 < min(data["train/entropy"]) < 0.42')
        assert (result.value, result.bound) == (0.4, 0.42)
        assert result.margin == pytest.approx(0.02 / 0.42)

    def test_two_metric_comparison_uses_the_right_side_as_bound(self):
        result = evaluate_rule(DATA, 'data["train/entropy"]["2"] < data["train/entropy"]["1"]')
        assert (result.value, result.bound) == (0.4, 0.5)
        assert result.margin == pytest.approx(0.2)

    def test_non_comparison_has_no_bound(self):
        result = evaluate_rule(DATA, 'all_finite(data["train/entropy"])')
        assert result.bound is None and result.margin is None and result.value is True
