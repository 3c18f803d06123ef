"""day0.frontend"""
