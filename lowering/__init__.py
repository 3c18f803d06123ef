"""day0.lowering"""
