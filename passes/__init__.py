"""day0.passes"""
