"""Trace-driven simulator: how would each autoscaler have done on this trace?"""
