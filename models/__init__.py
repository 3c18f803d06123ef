"""day0.models"""
