"""Measuring a policy: baseline and held-out evaluation, pre-flight signal checks, reports."""
