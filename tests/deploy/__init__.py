"""Tests of the deployment material: the chart, the image recipe and its locks, the tool fetcher."""
