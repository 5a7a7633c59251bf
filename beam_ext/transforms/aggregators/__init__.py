"""Invertible aggregators (add / remove / get) for exact sliding windows."""
from beam_ext.transforms.aggregators.base import Aggregator
from beam_ext.transforms.aggregators.count import Count
from beam_ext.transforms.aggregators.distinct import CountDistinct
from beam_ext.transforms.aggregators.extremum import Max, Min
from beam_ext.transforms.aggregators.mean import Mean
from beam_ext.transforms.aggregators.sum import Sum
from beam_ext.transforms.aggregators.variance import StdDev, Variance

__all__ = ["Aggregator", "Count", "CountDistinct", "Max", "Mean", "Min", "StdDev", "Sum", "Variance"]
