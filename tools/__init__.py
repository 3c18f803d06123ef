"""day0.tools"""
