"""day0.runtime"""
